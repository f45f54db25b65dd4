// Epilogue of a consumer warpgroup: its 64 normalised O rows go from registers straight to
// global memory (rows past seqlen_q are skipped) and LSE goes out per row. Writing from
// registers leaves the Q buffer free as soon as the last S GEMM has read it, so the producer
// can load the next tile's Q while this epilogue runs.
#pragma once
#include <cstdint>

#include "hopper/forward_params.hpp"
#include "hopper/fragment.cuh"
#include "hopper/ptx/math.cuh"

namespace warpattn::detail {

template <class Cfg>
__device__ __forceinline__ void store_output(const float (&o)[Cfg::kHeadDim / 2], const float (&lse)[2],
                                             const ForwardParams& params, const FragmentCoords& f,
                                             int warpgroup, int m_block, int head, int batch) {
  const int row_start = m_block * Cfg::kBlockM + warpgroup * 64;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_start + f.row(r);
    if (row >= params.seqlen_q) continue;
    uint32_t* out_row = reinterpret_cast<uint32_t*>(
        static_cast<uint16_t*>(params.out) + batch * params.out_stride_batch +
        row * params.out_stride_row + head * params.out_stride_head);
#pragma unroll
    for (int j = 0; j < Cfg::kHeadDim / 8; ++j)  // columns 8j + 2q, 8j + 2q + 1
      out_row[f.col(j, 0) / 2] = ptx::pack_pair<typename Cfg::Element>(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
    if (params.lse != nullptr && f.quad == 0)
      params.lse[batch * params.lse_stride_batch + head * params.lse_stride_head +
                 row * params.lse_stride_row] = lse[r];
  }
}

}  // namespace warpattn::detail
