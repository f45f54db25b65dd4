// Backward kernels for __half, head dim 256.
#include "hopper/backward/run_backward.cuh"

WARPATTN_BACKWARD_INSTANCE(__half, 256)
