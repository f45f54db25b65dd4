// The combine of a KV-cache launch whose tiles' keys are split (flash-decoding): each piece of a
// tile left its partial state (split_tail_combine.cuh's PartialState: O unnormalised, row
// references and sums) in the slot of its table entry; this kernel adds a tile's pieces in
// order (the same sums in the same order every launch), then finalizes and stores like the
// forward kernel's packed epilogue.
#pragma once

#include <cmath>

#include "hopper/epilogue.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/split_tail_combine.cuh"
#include "hopper/varlen/varlen_tiles.hpp"

namespace warpattn::detail {

// Grid (tiles of the unsplit plan: entries / splits, at most; consumer warpgroups), 128
// threads: tile u's pieces are the plan's entries u x splits .. + splits - 1
// (varlen_tiles.hpp). Every thread runs to the end: the store's shuffles need whole warps.
template <class Cfg>
__global__ void __launch_bounds__(128) combine_kvcache_splits_kernel(const __grid_constant__ ForwardParams params,
                                                                     int splits) {
  const int first = static_cast<int>(blockIdx.x) * splits;
  if (first >= *params.varlen_tile_count) return;  // the whole CTA: past the plan's tiles
  const VarlenTile entry = params.varlen_tiles[first];
  const int warpgroup = static_cast<int>(blockIdx.y), thread = static_cast<int>(threadIdx.x);
  const FragmentCoords f(thread);
  const int first_position = entry.block * params.packing.positions;
  float o[Cfg::kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) o[i] = 0.f;
  OnlineSoftmax s(Cfg::kPLog2Offset, Cfg::kStaleLog2);
  if (holds_stored_rows(warpgroup, f, first_position, entry.head, params.packing, entry.seqlen_q))
    for (int i = 0; i < splits; ++i) PartialState<Cfg>(params, first + i, warpgroup, thread).add_to(o, s);
  float sink_log2[2], lse[2];
  packed_row_sinks(params, warpgroup, f, first_position, entry.head, entry.seqlen_q, sink_log2);
  s.finalize_rows(o, lse, sink_log2[0], sink_log2[1]);
  store_packed_output<Cfg>(o, lse, params, f, warpgroup, first_position, entry.head, entry.batch, entry.seqlen_q);
}

}  // namespace warpattn::detail
