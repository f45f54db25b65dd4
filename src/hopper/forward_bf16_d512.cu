// Forward kernels for __nv_bfloat16, head dim 512 (dense and packed batches: split_head_dim.cuh).
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_INSTANCE(__nv_bfloat16, 512)
