// Online softmax in base 2 for one thread's two rows of a 64 x kBlockN score tile.
// c = softmax_scale * log2(e) is folded in, so each probability is one FFMA and one MUFU.EX2:
//   m_new = max(m_old, rowmax(S));  alpha = 2^((m_old - m_new) c);  P = 2^(S c - m_new c)
//   l = alpha l + rowsum(P);        O = alpha O + P V
// The running max stays in raw score units. A row that has seen only -inf uses 0 in place of
// its max, so it never computes -inf - (-inf): its P, l and alpha are 0.
// Row sums stay per-thread until finalize (only the max needs the quad each tile).
#pragma once

#include <cmath>

#include "hopper/fragment.cuh"
#include "hopper/ptx/math.cuh"

namespace warpattn::detail {

struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
  float scale_log2;

  __device__ __forceinline__ explicit OnlineSoftmax(float c) : scale_log2(c) {}

  // Replaces s by unnormalised probabilities; alpha gets each row's rescale factor for O.
  template <bool kFirst, int kRegs>
  __device__ __forceinline__ void step(float (&s)[kRegs], float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j)
        m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      m = quad_max(m);
      const float m_scaled = (m == -INFINITY ? 0.f : m) * scale_log2;
      alpha[r] = kFirst ? 1.f : ptx::exp2_approx(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = m;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& x = s[4 * j + 2 * r + c];
          x = ptx::exp2_approx(fmaf(x, scale_log2, -m_scaled));
          sum += x;
        }
      row_sum[r] = kFirst ? sum : fmaf(row_sum[r], alpha[r], sum);
    }
  }

  // Normalises O by the full row sums and returns each row's natural-log LSE; rows with no
  // visible key get O = 0 and LSE = -inf.
  template <int kRegs>
  __device__ __forceinline__ void finalize(float (&o)[kRegs], float (&lse)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(row_sum[r]);
      const bool empty = !(l > 0.f);  // also catches NaN
      const float inv = empty ? 0.f : 1.f / l;
      lse[r] = empty ? -INFINITY : (row_max[r] * scale_log2 + ptx::log2_approx(l)) * 0.69314718055994531f;
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j) {
        o[4 * j + 2 * r] *= inv;
        o[4 * j + 2 * r + 1] *= inv;
      }
    }
  }
};

// O *= alpha per row (after the P·V GEMM that wrote O has completed).
template <int kRegs>
__device__ __forceinline__ void rescale_rows(float (&o)[kRegs], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      o[4 * j + 2 * r] *= alpha[r];
      o[4 * j + 2 * r + 1] *= alpha[r];
    }
}

}  // namespace warpattn::detail
