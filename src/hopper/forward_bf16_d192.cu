// Forward kernels for __nv_bfloat16, q and k head dim 192 with v 128 (MLA's prefill; ForwardConfig's kHeadDimV).
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_INSTANCE(__nv_bfloat16, 192)
