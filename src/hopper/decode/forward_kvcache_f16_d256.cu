// KV-cache forward kernels for __half, head dim 256.
#include "hopper/decode/run_kvcache.cuh"

WARPATTN_FORWARD_KVCACHE_INSTANCE(__half, 256)
