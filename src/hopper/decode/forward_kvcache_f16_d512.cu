// KV-cache forward kernels for __half, head dim 512 (and the padded dims 264..504): the split-head-dim
// consumer (split_head_dim.cuh), both warpgroups on 64 packed rows, each half of the head dim.
#include "hopper/decode/run_kvcache.cuh"

WARPATTN_FORWARD_KVCACHE_INSTANCE(__half, 512)
