// Softcap (Gemma 2, Grok): scores become softcap * tanh(scale * s / softcap) before the mask and
// the softmax, so no logit leaves (-softcap, softcap).
//
// The forward takes tanh.approx.f32: one MUFU op per score, as FlashAttention-3 does. The PTX ISA
// bounds its relative error by about 2^-11, but on the H200 it measured 1.1e-5 relative and 8e-6
// absolute over 121M inputs (tools/probes/p_tanh_approx.cu, run 133): a logit error of 2.4e-4 at
// softcap 30, which moves P by 0.024%, a tenth of P's 16-bit rounding. It made softcap 1.27x,
// 1.25x and 1.12x faster at d = 64, 128 and 256 (run 134, means of 2 passes) than the form
// below, which the forward took before (one MUFU.EX2 and one MUFU.RCP per score; moving the
// reciprocal to the FMA pipe had bought nothing, run 127).
// The backward keeps tanh(x) = 1 - 2 / (2^(2 log2(e) x) + 1), about 2e-7 absolute
// (scripts/softcap_rcp_sim.py): its GEMMs, not the MUFU unit, bound it. Large |x| saturate
// exactly (2^(+big) = inf gives 1, 2^(-big) = 0 gives -1); NaN stays NaN in both forms.
#pragma once

#include "hopper/ptx/math.cuh"

namespace warpattn::detail {

// s (raw scores) -> tanh(scale s / softcap), given ex2_scale = 2 log2(e) scale / softcap. The
// softmax then takes them with softcap log2(e) in place of scale log2(e).
template <bool kForward, int kRegs>
__device__ __forceinline__ void softcap_scores(float (&s)[kRegs], float ex2_scale) {
  if constexpr (kForward) {
    const float x_scale = ex2_scale * 0.34657359027997264f;  // scale / softcap = ex2_scale ln(2) / 2
#pragma unroll
    for (int i = 0; i < kRegs; ++i) s[i] = ptx::tanh_approx(s[i] * x_scale);
  } else {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) s[i] = fmaf(-2.f, ptx::rcp_approx(ptx::exp2_approx(s[i] * ex2_scale) + 1.f), 1.f);
  }
}

}  // namespace warpattn::detail
