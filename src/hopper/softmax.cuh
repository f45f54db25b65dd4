// Online softmax in base 2 for one thread's two rows of a 64 x kBlockN score tile.
// c = softmax_scale * log2(e) (times the FP8 descales of the tile) is folded in, so each
// probability is one FFMA and one MUFU.EX2:
//   m_new = max(m_old, c rowmax(S));  alpha = 2^(m_old - m_new);  P = 2^(S c - m_new + offset)
//   l = alpha l + rowsum(P);          O = alpha O + P V
// The running max is kept in scaled (log2) units, so c may change from key tile to key tile.
// offset (kPLog2Offset) lifts FP8's P into e4m3's range; the LSE takes it out again.
// A row that has seen only -inf uses 0 in place of its max, so it never computes
// -inf - (-inf): its P, l and alpha are 0. Row sums stay per-thread until finalize.
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
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
  float p_log2_offset;
  float addend[2], scale;  // from update_max to exponentiate

  __device__ __forceinline__ explicit OnlineSoftmax(float offset = 0.f) : p_log2_offset(offset) {}

  // The online softmax of one key tile in two halves, so that the caller can rescale O between
  // them (ptxas then fills the MUFU's issue gaps in exponentiate with the FMULs):
  //   update_max: each row's new max, alpha (its rescale factor for O) and the exponent addend;
  //   exponentiate: s -> unnormalised probabilities, and the row sums.
  // c (> 0) converts this tile's raw scores to log2 units. kLifted: s holds kIntScoreOffset + s
  // (lift_int_scores). The max subtracts the offset exactly; the exponent's FFMA gets it in its
  // addend, -(base + offset c) rounded once: an error below one integer score unit times c, the
  // same for the row's whole tile, where INT8's rounding of Q and K moves a score by tens of
  // units.
  template <bool kFirst, bool kLifted = false, int kRegs>
  __device__ __forceinline__ void update_row_max(const float (&s)[kRegs], int r, float (&alpha)[2], float c) {
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
    float m = chain[0];
#pragma unroll
    for (int k = 1; k < kChains; ++k) m = fmaxf(m, chain[k]);
    m = quad_max(m);
    if constexpr (kLifted) m -= kIntScoreOffset;
    m = fmaxf(row_max[r], m * c);
    const float base = (m == -INFINITY ? 0.f : m) - p_log2_offset;
    addend[r] = kLifted ? -fmaf(kIntScoreOffset, c, base) : -base;
    alpha[r] = kFirst ? 1.f : ptx::exp2_approx(row_max[r] - (m == -INFINITY ? 0.f : m));
    row_max[r] = m;
  }

  template <bool kFirst, int kRegs>
  __device__ __forceinline__ void exponentiate_row(float (&s)[kRegs], int r, const float (&alpha)[2]) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        float& x = s[4 * j + 2 * r + k];
        x = ptx::exp2_approx(fmaf(x, scale, addend[r]));
        sum += x;
      }
    row_sum[r] = kFirst ? sum : fmaf(row_sum[r], alpha[r], sum);
  }

  template <bool kFirst, bool kLifted = false, int kRegs>
  __device__ __forceinline__ void update_max(const float (&s)[kRegs], float (&alpha)[2], float c) {
#pragma unroll
    for (int r = 0; r < 2; ++r) update_row_max<kFirst, kLifted>(s, r, alpha, c);
  }
  template <bool kFirst, int kRegs>
  __device__ __forceinline__ void exponentiate(float (&s)[kRegs], const float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) exponentiate_row<kFirst>(s, r, alpha);
  }

  // Both halves, for callers with nothing to do between them.
  template <bool kFirst, bool kLifted = false, int kRegs>
  __device__ __forceinline__ void step(float (&s)[kRegs], float (&alpha)[2], float c) {
    update_max<kFirst, kLifted>(s, alpha, c);
    exponentiate<kFirst>(s, alpha);
  }

  // Normalises O by the full row sums (times o_scale: FP8's V descale) and returns each row's
  // natural-log LSE; rows with no visible key get O = 0 and LSE = -inf.
  template <int kRegs>
  __device__ __forceinline__ void finalize(float (&o)[kRegs], float (&lse)[2], float o_scale = 1.f) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(row_sum[r]);
      const bool empty = !(l > 0.f);  // also catches NaN
      const float inv = empty ? 0.f : o_scale / l;
      lse[r] = empty ? -INFINITY : (row_max[r] + ptx::log2_approx(l) - p_log2_offset) * 0.69314718055994531f;
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j) {
        o[4 * j + 2 * r] *= inv;
        o[4 * j + 2 * r + 1] *= inv;
      }
    }
  }
};

// O *= alpha per row, times `units` for all rows (FP8: the ratio of the previous key tile's V
// descale to the next one's, so O stays in units of the V tile it accumulates next). After
// the P·V GEMM that wrote O has completed.
template <int kRegs>
__device__ __forceinline__ void rescale_row(float (&o)[kRegs], int r, float factor) {
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j) {
    o[4 * j + 2 * r] *= factor;
    o[4 * j + 2 * r + 1] *= factor;
  }
}
template <int kRegs>
__device__ __forceinline__ void rescale_rows(float (&o)[kRegs], const float (&alpha)[2], float units = 1.f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) rescale_row(o, r, alpha[r] * units);
}

}  // namespace warpattn::detail
