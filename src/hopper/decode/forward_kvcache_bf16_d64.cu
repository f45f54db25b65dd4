// KV-cache forward kernels for __nv_bfloat16, head dim 64.
#include "hopper/decode/run_kvcache.cuh"

WARPATTN_FORWARD_KVCACHE_INSTANCE(__nv_bfloat16, 64)
