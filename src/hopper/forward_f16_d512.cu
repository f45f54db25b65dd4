// Forward kernels for __half, head dim 512 (dense and packed batches: split_head_dim.cuh).
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_INSTANCE(__half, 512)
