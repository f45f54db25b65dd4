// FP8 forward kernels with INT8 Q and K, head dim 128 (bf16 and fp16 output).
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_FP8_INSTANCE(128, int8_t)
