// Online softmax in base 2 for one thread's two rows of a 64 x kBlockN score tile.
// c = softmax_scale * log2(e) (times the FP8 descales of the tile) is folded in, so each
// probability is one FFMA and one MUFU.EX2. Each row keeps a reference R in log2 units:
//   R_new = t if t > R + kStaleLog2 else R,  t = c rowmax(S) + log2 v   (v: FP8's V descale
//           of the tile, 1 otherwise);      alpha = 2^(R - R_new)
//   P = 2^(S c + log2 v - R_new + offset);  l = alpha l + rowsum(P) / v;  O = alpha O + P V
// So V's descale rides in P (O needs no rescale for it), and R moves only when the row max
// grows by more than kStaleLog2: then alpha is exactly 1 for most key tiles, and a warp whose
// rows all have alpha 1 skips O's rescale (rescale_if_needed), which at d = 256 is 128 FMULs
// per thread and key tile (run 52: +8% when skipped). With a stale R, P reaches
// 2^(offset + kStaleLog2) (FlashAttention-4's conditional rescaling).
// offset (kPLog2Offset) lifts FP8's P into e4m3's range; the LSE takes it out again.
// A row that has seen only -inf uses 0 in place of R, so it never computes -inf - (-inf): its
// P, l and alpha are 0. Row sums stay per-thread until finalize.
#pragma once

#include <cmath>

#include "common/magic_int_float.hpp"
#include "hopper/fragment.cuh"
#include "hopper/ptx/math.cuh"

namespace warpattn::detail {

// INT8 Q and K leave int32 scores s, exact (|s| <= 256 x 128² = 2²²), as bits in the score
// registers. Adding kMagicIntFloatBits to the bits makes them the floats kMagicIntFloat + s
// exactly: one integer add per score instead of a conversion. The softmax takes the offset
// out of the row max exactly and folds it into each row's FFMA addend (kLifted).
inline constexpr float kIntScoreOffset = kMagicIntFloat;
template <int kRegs>
__device__ __forceinline__ void lift_int_scores(float (&s)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) s[i] = __int_as_float(__float_as_int(s[i]) + kMagicIntFloatBits);
}

struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY};  // R, the rows' references (log2 units)
  float row_sum[2] = {0.f, 0.f};
  float p_log2_offset, stale_log2;
  float addend[2], scale;  // from update_row_max to exponentiate_row

  // offset: kPLog2Offset. stale: kStaleLog2 (P <= 2^(offset + stale) must fit P's type).
  __device__ __forceinline__ OnlineSoftmax(float offset, float stale) : p_log2_offset(offset), stale_log2(stale) {}

  // The online softmax of one key tile, one row at a time and in two halves, so that the
  // caller can order them against the P·V wait and O's rescale (ConsumerTile::run):
  //   update_row_max: the row's reference, alpha (its rescale factor for O), the exponent's addend;
  //   exponentiate_row: s -> unnormalised probabilities, and the row sum.
  // c (> 0) converts this tile's raw scores to log2 units; v_log2 = log2 of FP8's V descale
  // (0 otherwise). kLifted: s holds kIntScoreOffset + s (lift_int_scores). The max subtracts the
  // offset exactly; the exponent's FFMA gets it in its addend, rounded once: an error below one
  // integer score unit times c, the same for the row's whole tile, where INT8's rounding of Q
  // and K moves a score by tens of units.
  template <bool kFirst, bool kLifted = false, int kRegs>
  __device__ __forceinline__ void update_row_max(const float (&s)[kRegs], int r, float (&alpha)[2], float c,
                                                 float v_log2 = 0.f) {
    // Four independent chains: a single chain of kRegs/2 dependent FMNMX would be the longest
    // latency of the softmax.
    constexpr int kPairs = kRegs / 4, kChains = kPairs < 4 ? kPairs : 4;
    scale = c;
    float chain[kChains];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const float pair = fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
      chain[j % kChains] = j < kChains ? pair : fmaxf(chain[j % kChains], pair);
    }
    float t = chain[0];
#pragma unroll
    for (int k = 1; k < kChains; ++k) t = fmaxf(t, chain[k]);
    t = quad_max(t);
    if constexpr (kLifted) t -= kIntScoreOffset;
    t = fmaf(t, c, v_log2);
    // From -inf any finite t moves R; a NaN t never does (the NaN then reaches P and l).
    const bool moves = t > row_max[r] + stale_log2;
    const float ref = moves ? t : row_max[r];
    alpha[r] = kFirst || !moves ? 1.f : ptx::exp2_approx(row_max[r] - ref);  // R = -inf: 0
    row_max[r] = ref;
    const float base = (ref == -INFINITY ? 0.f : ref) - p_log2_offset - v_log2;
    addend[r] = kLifted ? -fmaf(kIntScoreOffset, c, base) : -base;
  }

  // inv_v: 1 / FP8's V descale (1 otherwise): the row sum counts P without it.
  template <bool kFirst, int kRegs>
  __device__ __forceinline__ void exponentiate_row(float (&s)[kRegs], int r, const float (&alpha)[2],
                                                   float inv_v = 1.f) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        float& x = s[4 * j + 2 * r + k];
        x = ptx::exp2_approx(fmaf(x, scale, addend[r]));
        sum += x;
      }
    row_sum[r] = kFirst ? sum * inv_v : fmaf(row_sum[r], alpha[r], sum * inv_v);
  }

  // Both rows, both halves, for callers with nothing to do between them.
  template <bool kFirst, bool kLifted = false, int kRegs>
  __device__ __forceinline__ void step(float (&s)[kRegs], float (&alpha)[2], float c, float v_log2 = 0.f,
                                       float inv_v = 1.f) {
#pragma unroll
    for (int r = 0; r < 2; ++r) update_row_max<kFirst, kLifted>(s, r, alpha, c, v_log2);
#pragma unroll
    for (int r = 0; r < 2; ++r) exponentiate_row<kFirst>(s, r, alpha, inv_v);
  }

  // Normalises O by the full row sums and returns each row's natural-log LSE; rows with no
  // visible key get O = 0 and LSE = -inf. sink_log2: an attention sink's logit in log2 units
  // (-inf: none), one more term of the denominator with no value: l + 2^(sink - R + offset),
  // rebased on max(R, sink) so that neither term overflows; then a row with no key gets O = 0
  // and LSE = the sink.
  template <int kRegs>
  __device__ __forceinline__ void finalize(float (&o)[kRegs], float (&lse)[2], float sink_log2 = -INFINITY) {
    finalize_rows(o, lse, sink_log2, sink_log2);
  }
  // The same with a sink of each row's own (a KV cache's packed rows belong to different heads).
  template <int kRegs>
  __device__ __forceinline__ void finalize_rows(float (&o)[kRegs], float (&lse)[2], float sink0_log2, float sink1_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sink_log2 = r == 0 ? sink0_log2 : sink1_log2;
      float l = quad_sum(row_sum[r]);
      float ref = row_max[r], o_scale = 1.f;
      if (sink_log2 != -INFINITY) {
        const float top = fmaxf(ref, sink_log2);
        o_scale = ptx::exp2_approx(ref - top);  // R = -inf (no key): 0, and l is 0 too
        l = fmaf(l, o_scale, ptx::exp2_approx(sink_log2 - top + p_log2_offset));
        ref = top;
      }
      const bool empty = !(l > 0.f);  // also catches NaN
      const float inv = empty ? 0.f : o_scale / l;
      lse[r] = empty ? -INFINITY : (ref + ptx::log2_approx(l) - p_log2_offset) * 0.69314718055994531f;
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j) {
        o[4 * j + 2 * r] *= inv;
        o[4 * j + 2 * r + 1] *= inv;
      }
    }
  }
};

// O *= alpha per row. After the P·V GEMM that wrote O has completed.
template <int kRegs>
__device__ __forceinline__ void rescale_rows(float (&o)[kRegs], const float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < kRegs / 4; ++j) {
      o[4 * j + 2 * r] *= alpha[r];
      o[4 * j + 2 * r + 1] *= alpha[r];
    }
}
// The same, skipped by a warp whose 16 rows all kept their reference (alpha exactly 1).
template <int kRegs>
__device__ __forceinline__ void rescale_if_needed(float (&o)[kRegs], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) rescale_rows(o, alpha);
}

}  // namespace warpattn::detail
