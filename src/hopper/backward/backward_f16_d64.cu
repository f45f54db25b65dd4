// Backward kernels for __half, head dim 64.
#include "hopper/backward/run_backward.cuh"

WARPATTN_BACKWARD_INSTANCE(__half, 64)
