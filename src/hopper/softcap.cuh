// Softcap (Gemma 2, Grok): scores become softcap * tanh(scale * s / softcap) before the mask and
// the softmax, so no logit leaves (-softcap, softcap).
//
// tanh(x) = 1 - 2 / (2^(2 log2(e) x) + 1): one MUFU.EX2 per score and, in the forward below
// d = 256, a reciprocal on the FMA pipe, about 2e-7 absolute (the same as with MUFU.RCP:
// scripts/softcap_rcp_sim.py). The EX2 + RCP form cost softcap 49% at d = 64 and 32% at d = 128
// (run 121); moving the reciprocal's one MUFU op to seven FMA-pipe instructions bought nothing
// measurable (run 127: 0.53 and 0.67 of causal's TFLOP/s, against 0.51 and 0.68), so what bounds
// softcap there is still to be profiled (the CLI's --softcap under Nsight Compute).
// tanh.approx.f32 would take one MUFU op but is only good to 2^-11 relative: at a logit of 30
// under softcap 50 that is 0.015, which moves P by 1.5%, several times the 16-bit rounding of P
// the rest of the kernel is held to. Large |x| saturate exactly: 2^(+big) = inf gives 1,
// 2^(-big) = 0 gives -1; NaN stays NaN.
#pragma once

#include "hopper/ptx/math.cuh"

namespace warpattn::detail {

// 1 / d for d >= 1 (or NaN) without the MUFU unit: a seed from the exponent bits (within 12.5%),
// then three Newton steps r += r (1 - d r), each squaring the relative error (2^-3 -> 2^-24).
// d past 2^100 (inf: a saturated 2^x) is taken as 2^100, whose reciprocal is 0 to tanh's
// precision; the comparison keeps a NaN a NaN (fminf would not).
__device__ __forceinline__ float reciprocal_of_at_least_one(float d) {
  d = d > 0x1p100f ? 0x1p100f : d;
  float r = __int_as_float(0x7EF311C7 - __float_as_int(d));
#pragma unroll
  for (int step = 0; step < 3; ++step) r = fmaf(r, fmaf(-d, r, 1.f), r);
  return r;
}

// s (raw scores) -> tanh(scale s / softcap), given ex2_scale = 2 log2(e) scale / softcap. The
// softmax then takes them with softcap log2(e) in place of scale log2(e). kFmaReciprocal: the
// reciprocal on the FMA pipe (the forward below d = 256, whose softmax the MUFU unit bounds), or
// MUFU.RCP (d = 256, GEMM-bound, where the Newton steps' registers spilled; and the backward).
// WARPATTN_TUNE_SOFTCAP_TANH=1 (a tuning build, not a supported mode): the forward takes
// tanh.approx.f32 instead, one MUFU op per score as FlashAttention-3 does, to measure what the
// precise form costs against it (run 129: softcap at 0.72-0.80 of FA3's speed) and what the
// approximation costs in accuracy (the GPU tests' bounds).
#ifndef WARPATTN_TUNE_SOFTCAP_TANH
#define WARPATTN_TUNE_SOFTCAP_TANH 0
#endif
// kForward: the forward's scores (the backward keeps the precise form whatever the tuning).
template <bool kFmaReciprocal, bool kForward, int kRegs>
__device__ __forceinline__ void softcap_scores(float (&s)[kRegs], float ex2_scale) {
  if constexpr (WARPATTN_TUNE_SOFTCAP_TANH && kForward) {
    const float x_scale = ex2_scale * 0.34657359027997264f;  // scale / softcap = ex2_scale ln(2) / 2
#pragma unroll
    for (int i = 0; i < kRegs; ++i) s[i] = ptx::tanh_approx(s[i] * x_scale);
    return;
  }
#pragma unroll
  for (int i = 0; i < kRegs; ++i) {
    const float d = ptx::exp2_approx(s[i] * ex2_scale) + 1.f;
    s[i] = fmaf(-2.f, kFmaReciprocal ? reciprocal_of_at_least_one(d) : ptx::rcp_approx(d), 1.f);
  }
}

}  // namespace warpattn::detail
