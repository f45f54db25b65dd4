// FP8 forward kernels, head dim 64 (bf16 and fp16 output): Q and K rows are 64 bytes,
// stored 64B-swizzled.
#include "hopper/forward_instance.cuh"

WARPATTN_FORWARD_FP8_INSTANCE(64, __nv_fp8_e4m3)
