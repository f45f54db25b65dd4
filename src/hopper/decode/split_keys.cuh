// A KV cache's split keys (KvCacheConfig::kSplitKeys): where warpgroup 1's rows are all padding
// (a decode step packs its few real rows into warpgroup 0's: 4 rows of 128 at one position with 4
// query heads a KV head), warpgroup 1 would idle beside warpgroup 0, which then runs every key
// tile's S GEMM, softmax and P·V alone. Instead both compute warpgroup 0's rows, each on every
// other key tile of the work tile (TileContext::step; the other's tiles take their ping-pong turn
// and ring slots in between, skip_key_tiles), and warpgroup 1 hands its state to warpgroup 0
// through shared memory after SharedStorage (exchange_buffer): each thread's O registers and
// its two rows' references and partial sums, to the thread of warpgroup 0 that holds the same
// fragment (the same layout: no shuffle), which merges them as the split combine does.
#pragma once

#include <cmath>

#include "hopper/barriers.hpp"
#include "hopper/epilogue.cuh"
#include "hopper/producer.cuh"
#include "hopper/ptx/math.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/shared_storage.cuh"
#include "hopper/softmax.cuh"
#include "hopper/tile_scheduler.cuh"

namespace warpattn::detail {

// Whether work tile w splits its keys: warpgroup 1's first row (its lowest position) holds no
// stored row. The same answer in both warpgroups.
template <class Cfg>
__device__ __forceinline__ bool splits_keys(const ScheduledTile& w, const ForwardParams& params, int seqlen_q) {
  return !packed_row_place(64, first_row_of_block<Cfg>(w.m_block, params), w.head, params.packing, seqlen_q).stored;
}

// Warpgroup 1's state into warpgroup 0's (o and softmax there become the merged ones); both
// warpgroups call it, after their last P·V. The buffer is free again when it returns.
template <class Cfg>
__device__ __forceinline__ void merge_split_keys(SharedStorage<Cfg>& ss, int warpgroup, float (&o)[Cfg::kOCols / 2],
                                                 OnlineSoftmax& softmax) {
  constexpr int kRegs = Cfg::kOCols / 2;
  float* x = exchange_buffer(ss);
  const int t = static_cast<int>(threadIdx.x % 128);
  const auto at = [t](int word) { return word * 128 + t; };  // word-major: conflict-free
  if (warpgroup == 1) {
#pragma unroll
    for (int j = 0; j < kRegs; ++j) x[at(j)] = o[j];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      x[at(kRegs + r)] = softmax.row_max[r];
      x[at(kRegs + 2 + r)] = softmax.row_sum[r];
    }
  }
  ptx::named_barrier_sync(Barrier::kExchangeWritten, 256);
  if (warpgroup == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m0 = softmax.row_max[r], m1 = x[at(kRegs + r)];
      const float m = fmaxf(m0, m1);
      if (m == -INFINITY) continue;  // neither saw a key of this row
      const float a0 = ptx::exp2_approx(m0 - m), a1 = ptx::exp2_approx(m1 - m);  // -inf - m: 0
      softmax.row_max[r] = m;
      softmax.row_sum[r] = fmaf(softmax.row_sum[r], a0, x[at(kRegs + 2 + r)] * a1);
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = 4 * j + 2 * r + c;
          o[i] = fmaf(o[i], a0, x[at(i)] * a1);
        }
    }
  }
  ptx::named_barrier_sync(Barrier::kExchangeRead, 256);
}

}  // namespace warpattn::detail
