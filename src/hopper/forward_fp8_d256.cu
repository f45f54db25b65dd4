// FP8 forward kernels, head dim 256 (bf16 and fp16 output).
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_FP8_INSTANCE(256, __nv_fp8_e4m3)
