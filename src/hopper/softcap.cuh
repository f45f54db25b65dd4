// Softcap (Gemma 2, Grok): scores become softcap * tanh(scale * s / softcap) before the mask and
// the softmax, so no logit leaves (-softcap, softcap).
//
// tanh(x) = 1 - 2 / (2^(2 log2(e) x) + 1): one MUFU.EX2 and one MUFU.RCP per score, about 1e-7
// absolute. tanh.approx.f32 would take one MUFU op but is only good to 2^-11 relative: at a
// logit of 30 under softcap 50 that is 0.015, which moves P by 1.5%, several times the 16-bit
// rounding of P the rest of the kernel is held to. Large |x| saturate exactly: 2^(+big) = inf
// gives 1, 2^(-big) = 0 gives -1; NaN stays NaN.
#pragma once

#include "hopper/ptx/math.cuh"

namespace warpattn::detail {

// s (raw scores) -> tanh(scale s / softcap), given ex2_scale = 2 log2(e) scale / softcap. The
// softmax then takes them with softcap log2(e) in place of scale log2(e).
template <int kRegs>
__device__ __forceinline__ void softcap_scores(float (&s)[kRegs], float ex2_scale) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i)
    s[i] = fmaf(-2.f, ptx::rcp_approx(ptx::exp2_approx(s[i] * ex2_scale) + 1.f), 1.f);
}

}  // namespace warpattn::detail
