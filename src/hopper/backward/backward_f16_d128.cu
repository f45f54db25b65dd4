// Backward kernels for __half, head dim 128.
#include "hopper/backward/run_backward.cuh"

WARPATTN_BACKWARD_INSTANCE(__half, 128)
