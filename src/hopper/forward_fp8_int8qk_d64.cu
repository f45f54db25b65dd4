// FP8 forward kernels with INT8 Q and K, head dim 64 (bf16 and fp16 output).
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_FP8_INSTANCE(64, int8_t)
