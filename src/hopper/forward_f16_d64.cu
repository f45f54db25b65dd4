// Forward kernels for __half, head dim 64.
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_INSTANCE(__half, 64)
