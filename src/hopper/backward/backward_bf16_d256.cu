// Backward kernels for __nv_bfloat16, head dim 256.
#include "hopper/backward/run_backward.cuh"

WARPATTN_BACKWARD_INSTANCE(__nv_bfloat16, 256)
