// The E4M3 code of a 16-bit value under a descale, as the FP8 KV cache's device code writes it
// (the step's Q in quantize_cache_q.cu, new K and V rows in append_fp8_kv.cu): an IEEE
// division and a saturating round-to-nearest conversion, which the host's reference
// (src/reference/fp8_cache.hpp) matches bit for bit.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace warpattn::detail {

template <class T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

__device__ __forceinline__ uint8_t e4m3_code(float x, float descale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(x, descale), __NV_SATFINITE, __NV_E4M3));
}

}  // namespace warpattn::detail
