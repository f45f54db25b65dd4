// Arithmetic PTX the softmax uses: MUFU.EX2 and packing fp32 pairs into 16-bit pairs.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace warpattn::ptx {

// 2^x in one MUFU.EX2; ex2(-inf) = +0. Max relative error measured 1.5e-7 on our H200.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1/x in one MUFU.RCP (relative error about 2^-23); rcp(+inf) = +0.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh(x) in one MUFU.TANH; the PTX ISA gives its maximum relative error as about 2^-11, the
// H200 measured 1.1e-5 (tools/probes/p_tanh_approx.cu). The forward's softcap (softcap.cuh).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// log2(x) in one MUFU.LG2 (relative error about 2^-22): the LSE needs no more.
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Packs (lo, hi) into a 16-bit pair, lo in the low half (the even column of a fragment).
// cvt's first source goes to the upper half.
template <class Element>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack_pair<__nv_bfloat16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack_pair<__half>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Four floats to four E4M3 bytes (round to nearest even, saturating at +-448), x0 in the
// lowest byte. cvt's first source goes to the upper byte of each pair.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// The two values of a 16-bit pair, widened back to float (exact).
template <class Element>
__device__ __forceinline__ float2 unpack_pair(uint32_t pair);

template <>
__device__ __forceinline__ float2 unpack_pair<__nv_bfloat16>(uint32_t pair) {
  return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xFFFF0000u));
}
template <>
__device__ __forceinline__ float2 unpack_pair<__half>(uint32_t pair) {
  return __half22float2(*reinterpret_cast<const __half2*>(&pair));
}

}  // namespace warpattn::ptx
