// Epilogue of a consumer warpgroup: its 64 x d block of O goes through shared memory (the
// warpgroup's half of the Q tile, which no wgmma reads any more) and out by TMA stores,
// which drop rows past seqlen_q; LSE goes straight from registers.
#pragma once
#include <cstdint>

#include "hopper/barriers.hpp"
#include "hopper/forward_params.hpp"
#include "hopper/fragment.cuh"
#include "hopper/ptx/math.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"

namespace warpattn::detail {

// Byte offset of (row, col) in a [panel][rows][128 B] tile, 128B-swizzled: the 16-byte chunk
// index is XOR-ed with row mod 8 (the tile is 1024-byte aligned).
template <int kRowsPerPanel>
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col) {
  const int panel = col / 64, in_row = (col % 64) * 2;
  return panel * kRowsPerPanel * 128 + row * 128 + ((((in_row >> 4) ^ (row & 7)) << 4) | (in_row & 15));
}

template <class Cfg>
__device__ __forceinline__ void store_output(const float (&o)[Cfg::kHeadDim / 2], const float (&lse)[2],
                                             uint8_t* q_tile, const CUtensorMap* tm_o,
                                             const ForwardParams& params, const FragmentCoords& f,
                                             int warpgroup, int m_block, int head, int batch) {
  using namespace ptx;
  // This warpgroup's rows start 64 rows into each 128-row panel of the Q tile.
  const uint32_t base = smem_addr(q_tile) + warpgroup * 64 * 128;
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDim / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t addr = base + swizzled_offset<Cfg::kBlockM>(f.row(r), f.col(j, 0));
      const uint32_t pair = pack_pair<typename Cfg::Element>(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(pair) : "memory");
    }
  fence_proxy_async_shared();  // st.shared -> TMA store (async proxy)
  named_barrier_sync(Barrier::kEpilogue0 + warpgroup, 128);  // this warpgroup's writers

  const int row_start = m_block * Cfg::kBlockM + warpgroup * 64;
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int p = 0; p < Cfg::kPanels; ++p)
      tma_store_5d(tm_o, base + p * Cfg::kBlockM * 128, 0, row_start, p, head, batch);
    tma_store_commit();
  }
  if (params.lse != nullptr && f.quad == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row_start + f.row(r);
      if (row < params.seqlen_q)
        params.lse[batch * params.lse_stride_batch + head * params.lse_stride_head +
                   row * params.lse_stride_row] = lse[r];
    }
  }
  if (threadIdx.x % 128 == 0) tma_store_wait_read();  // smem must outlive the store's reads
}

}  // namespace warpattn::detail
