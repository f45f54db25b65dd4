// The combine of a KV-cache launch whose tiles' keys are split (flash-decoding): each piece of a
// tile left its partial state (split_tail_combine.cuh's PartialState: O unnormalised, row
// references and sums) in the slot of its piece index (kv_cache_pieces.hpp: tile u's pieces are
// u x splits .. + splits - 1); this kernel adds a tile's pieces in order (the same sums in the
// same order every launch), then finalizes and stores like the forward kernel's packed epilogue.
#pragma once

#include "hopper/decode/kv_cache_pieces.hpp"
#include "hopper/epilogue.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/ptx/grid_dependency.cuh"
#include "hopper/split_tail_combine.cuh"

namespace warpattn::detail {

// Grid (tiles, consumer warpgroups; a decode tile's: tiles, 1), 128 threads, launched with
// launch_dependent. Every thread runs to the end: the store's shuffles need whole warps. A
// decode tile's pieces each hold two states of the same 64 rows (its warpgroups took alternate
// key tiles): added piece by piece, warpgroup 0's then 1's.
template <class Cfg>
__global__ void __launch_bounds__(128) combine_kvcache_splits_kernel(const __grid_constant__ ForwardParams params) {
  // Launched as the attention's dependent (dependent_launch.cuh): its partial states are
  // complete and visible only past this wait.
  ptx::wait_for_preceding_grid();
  const int tile = static_cast<int>(blockIdx.x), splits = params.kv_work.splits;
  const WorkTile w = tile_coords(tile, TileGrid{params.m_blocks, params.heads_q, params.batch, 1});
  const int warpgroup = static_cast<int>(blockIdx.y), thread = static_cast<int>(threadIdx.x);
  const FragmentCoords f(thread);
  const int first_position = w.m_block * params.packing.positions, seqlen_q = params.seqlen_q;
  float o[Cfg::kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) o[i] = 0.f;
  OnlineSoftmax s(Cfg::kPLog2Offset, Cfg::kStaleLog2);
  // Unrolled so that the next piece's loads are in flight while one piece is added (each piece
  // is an L2 round trip, and a long cache's tile can have tens of them).
  if (holds_stored_rows(warpgroup, f, first_position, w.head, params.packing, seqlen_q)) {
    if constexpr (Cfg::kDecodeTile) {
      for (int i = 0; i < splits; ++i) {
        PartialState<Cfg>(params, tile * splits + i, 0, thread).add_to(o, s);
        PartialState<Cfg>(params, tile * splits + i, 1, thread).add_to(o, s);
      }
    } else {
#pragma unroll 2
      for (int i = 0; i < splits; ++i) PartialState<Cfg>(params, tile * splits + i, warpgroup, thread).add_to(o, s);
    }
  }
  float sink_log2[2], lse[2];
  packed_row_sinks(params, warpgroup, f, first_position, w.head, seqlen_q, sink_log2);
  s.finalize_rows(o, lse, sink_log2[0], sink_log2[1]);
  store_packed_output<Cfg>(o, lse, params, f, warpgroup, first_position, w.head, w.batch, seqlen_q);
}

}  // namespace warpattn::detail
