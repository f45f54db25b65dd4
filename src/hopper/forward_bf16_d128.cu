// Forward kernels for __nv_bfloat16, head dim 128.
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_INSTANCE(__nv_bfloat16, 128)
