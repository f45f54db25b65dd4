// Backward kernels for __nv_bfloat16, head dim 512 (and the padded head dims 264..504 that run in it):
// two CTAs per key block, one per half of the head dim (backward_config.hpp, kColumnHalves).
#include "hopper/backward/run_backward.cuh"

WARPATTN_BACKWARD_INSTANCE(__nv_bfloat16, 512)
