// KV-cache forward kernels over an E4M3 cache, head dim 256 (bf16 and fp16 q and out).
#include "hopper/decode/run_kvcache.cuh"

WARPATTN_FORWARD_KVCACHE_FP8_INSTANCE(256)
