// A KV-cache launch's split tiles merged inside the attention kernel (A/B knob
// WARPATTN_TUNE_KV_MERGE_IN_KERNEL): the consumer warpgroup that stores a tile's last partial
// state merges them all and stores the tile's output, so no combine kernel runs after it.
//
// Why: after a clean L2 flush, run 255's timeline (an H100, B = 8 4K) had the combine kernel
// end 5 us after the attention's last piece (its grid's wait, then a CTA's loads, finalize and
// store), against cuDNN's reduction's ~2.3. Here the last piece's warpgroup pays one counter
// round trip and one round trip for the other states' loads.
//
// How: each warpgroup that holds stored rows stores its state (forward_kernel.cuh), the
// warpgroup meets at a named barrier, and its thread 0 adds 1 to the (tile, warpgroup) counter
// with acquire-release at GPU scope: a release of the warpgroup's stores (ordered before it by
// the barrier), and an acquire of every earlier piece's. The one that finds splits - 1 resets
// the counter (the next launch on the stream starts after this one ends) and tells the
// warpgroup through the barrier's reduction; its warps then run the combine kernel's code
// (combine_splits.cuh, combine_tile_slice) on (row warp, column slice) pairs, a warp acting as
// the combine CTA's warp of those rows: the same loads and sums in the same order, so the same
// bits as the combine kernel, which still merges where the counters would not fit.
#pragma once

#include "hopper/barriers.hpp"
#include "hopper/decode/combine_splits.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/ptx/memory_order.cuh"
#include "hopper/ptx/warpgroup.cuh"

namespace warpattn::detail {

// The most tiles whose counters a launch may have (kConsumerWarpgroups each): a stream's
// counter array (scheduler_workspace.hpp). A split launch with more tiles (a forced split of
// many) uses the combine kernel.
inline constexpr int kMergeCounters = 2048;

// Which kernels merge in the kernel: not a split head dim's (its own consumer, shared rows),
// nor d = 256's (the banded kernel spilled its tile loop's counters with it, 28 bytes, with 8 or
// 4 states in flight alike).
template <class Cfg>
inline constexpr bool kMergesInKernel = WARPATTN_TUNE_KV_MERGE_IN_KERNEL && !Cfg::kSharedRows && Cfg::kHeadDim <= 128;

#if WARPATTN_TUNE_KV_MERGE_IN_KERNEL

// Called by every thread of consumer warpgroup `warpgroup` right after its part of piece
// `piece`'s state is stored (or, for threads that hold no stored row, right after the piece).
template <class Cfg>
__device__ __forceinline__ void merge_if_last_piece(const ForwardParams& params, int piece, int m_block, int chunk,
                                                    int warpgroup) {
  const int first_position = m_block * params.packing.positions, seqlen_q = params.seqlen_q;
  // A warpgroup whose first row is padding holds none (own_key_tiles): it stored nothing and
  // has nothing to merge. (The same for every piece of the tile.)
  if (!packed_row_place(64 * warpgroup, first_position, chunk, params.packing, seqlen_q).stored) return;
  const int splits = params.kv_work.splits, tile = piece / splits, thread = static_cast<int>(threadIdx.x) % 128;
  ptx::named_barrier_sync(Barrier::kMerge0 + warpgroup, 128);
  bool last = false;
  if (thread == 0) {
    int* counter = params.kv_merge_counters + tile * Cfg::kConsumerWarpgroups + warpgroup;
    last = ptx::fetch_add_acq_rel_gpu(counter, 1) == splits - 1;
    if (last) *counter = 0;
  }
  if (!ptx::named_barrier_or(Barrier::kMerge0 + warpgroup, 128, last)) return;
  constexpr int kSlices = Cfg::kHeadDim / kCombineSliceCols;
  const int warp = thread / 32, lane = thread % 32;
  for (int pair = warp; pair < 4 * kSlices; pair += 4) {
    const int row_warp = pair / kSlices;
    // (whole warps skip: the store's shuffles)
    if (!__any_sync(0xffffffffu, holds_stored_rows(warpgroup, FragmentCoords(row_warp * 32 + lane), first_position,
                                                   chunk, params.packing, seqlen_q)))
      continue;
    combine_tile_slice<Cfg>(params, tile, warpgroup, pair % kSlices, row_warp * 32 + lane);
  }
}
#endif

}  // namespace warpattn::detail
