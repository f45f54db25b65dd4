// Forward kernels for __nv_bfloat16, head dim 512 (the dense forward only: split_head_dim.cuh).
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_DENSE_INSTANCE(__nv_bfloat16, 512)
