// KV-cache forward kernels for __half, head dim 128.
#include "hopper/decode/run_kvcache.cuh"

WARPATTN_FORWARD_KVCACHE_INSTANCE(__half, 128)
