// Forward kernels for __half, head dim 512 (the dense forward only: split_head_dim.cuh).
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_DENSE_INSTANCE(__half, 512)
