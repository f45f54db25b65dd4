// The combine of a KV-cache launch whose tiles' keys are split (flash-decoding): each piece of a
// tile left its partial state (split_tail_combine.cuh's PartialState: O unnormalised, row
// references R and the thread's share of the row sums l) in the slot of its piece index
// (kv_cache_pieces.hpp: tile u's pieces are u x splits .. + splits - 1). This kernel merges a
// tile's states, then finalizes and stores like the forward kernel's packed epilogue.
//
// The states are merged in two passes, not one after another: first the largest reference of
// each row over all of them, then O = sum of O_i 2^(R_i - R) and l likewise, in piece order.
// Neither pass carries a dependency from one state's load to the next, so many loads are in
// flight at once; merging piece by piece (each a rescale of the running sum by the new
// reference) waited for one state's round trip before the next: with the states evicted from
// L2 by the cache's stream, run 143's B = 1 64K decode (32 states a tile) spent tens of
// microseconds there. The order is fixed, so the bits repeat, and a state that saw no key
// (R = -inf, O = 0, l = 0: a piece past a short sequence's chunks) adds exact zeros.
// What is left is the number of round trips after the attention's last piece: with 8 states'
// references and then 4 states' sums in flight at a time, run 247's trace (an H100) had the
// combine end 7.8 us after the attention at 16 states a tile and 3.9 us at 2, ~1 us a round
// trip. So the first kCombineBatch states' loads go out together with the references of the
// next 8, and each later batch is one more round trip: 16 states take two, not six.
//
// Grid (tiles, the consumer warpgroups that hold stored rows (one where they share them:
// combine_slices.hpp), column slices of 32: head_dim / 32), 128 threads, launched with launch_dependent. Each CTA adds its 32
// columns of O (four float4 groups) and the rows' references and sums, which every slice
// computes alike (same loads, same order: the same lse bits; slice 0 stores it). Every thread
// runs to the end: the quad sums and the store's shuffles need whole warps.
#pragma once

#include "hopper/decode/combine_slices.hpp"
#include "hopper/decode/kv_cache_pieces.hpp"
#include "hopper/decode/kv_trace.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/ptx/grid_dependency.cuh"
#include "hopper/split_tail_combine.cuh"

namespace warpattn::detail {

// States whose loads are in flight together in the sums' pass: 8 x (4 + 16) registers a
// thread at 32 columns a CTA.
inline constexpr int kCombineBatch = 8;

// kCombineBatch states' {R0, R1, l0, l1} and O groups, every load of the batch issued before the
// first is used. Past the last state the batch loads the last one again (not predicated: with
// the loads conditional, ptxas put each first use between them, one round trip apart) and adds
// nothing.
template <int kGroups>
struct CombineBatch {
  float4 stats[kCombineBatch];
  float4 groups[kCombineBatch][kGroups];

  template <class StateAt>
  __device__ __forceinline__ void load(const StateAt& state, int k0, int states, int first_group) {
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const auto st = state(min(k0 + j, states - 1));
      stats[j] = st.stats();
#pragma unroll
      for (int g = 0; g < kGroups; ++g) groups[j][g] = st.group(first_group + g);
    }
  }

  // Adds states k0 .. in order into o (zero at first) and the row sums, each at 2^(R_k - R) with
  // R the rows' merged references (s.row_max): the same sums in the same order in every launch.
  __device__ __forceinline__ void add(int k0, int states, float (&o)[4 * kGroups], OnlineSoftmax& s) const {
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      if (k0 + j < states) {
        const float4 x = stats[j];
        // 0 for a state that saw no key (R = -inf), and for every state of a row none saw.
        const float w0 = x.x == -INFINITY ? 0.f : ptx::exp2_approx(x.x - s.row_max[0]);
        const float w1 = x.y == -INFINITY ? 0.f : ptx::exp2_approx(x.y - s.row_max[1]);
        s.row_sum[0] = fmaf(x.z, w0, s.row_sum[0]);
        s.row_sum[1] = fmaf(x.w, w1, s.row_sum[1]);
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const float4 v = groups[j][g];
          o[4 * g] = fmaf(v.x, w0, o[4 * g]);
          o[4 * g + 1] = fmaf(v.y, w0, o[4 * g + 1]);
          o[4 * g + 2] = fmaf(v.z, w1, o[4 * g + 2]);
          o[4 * g + 3] = fmaf(v.w, w1, o[4 * g + 3]);
        }
      }
    }
  }
};

template <class Cfg>
__global__ void __launch_bounds__(128) combine_kvcache_splits_kernel(const __grid_constant__ ForwardParams params) {
  // Launched as the attention's dependent (dependent_launch.cuh): its partial states are
  // complete and visible only past this wait.
  trace_combine(params, kTraceCombineEntry);
  ptx::wait_for_preceding_grid();
  trace_combine(params, kTraceCombineReady);
  constexpr int kSliceGroups = kCombineSliceCols / 8;
  const int tile = static_cast<int>(blockIdx.x), splits = params.kv_work.splits;
  const WorkTile w = tile_coords(tile, TileGrid{params.m_blocks, params.heads_q, params.batch, 1});
  // The CTA's rows, state part and columns (combine_slices.hpp): where each warpgroup has rows
  // of its own, its rows, its part, groups from slice x 4, written out (through combine_slice
  // those kernels' machine code changed: the same values, scheduled otherwise); where they share
  // the rows (d = 512), rows 0-63 from the part that holds the slice's columns.
  const int warpgroup = Cfg::kSharedRows ? 0 : static_cast<int>(blockIdx.y), slice = static_cast<int>(blockIdx.z);
  constexpr CombineSlice kNone{0, 0, 0};
  const CombineSlice shared = Cfg::kSharedRows ? combine_slice(0, slice, Cfg::kOCols, true) : kNone;
  const int thread = static_cast<int>(threadIdx.x);
  const FragmentCoords f(thread);
  const int first_position = w.m_block * params.packing.positions, seqlen_q = params.seqlen_q;
  // State k of the tile: piece k's, the part that holds this CTA's rows and columns.
  const int states = splits;
  auto state = [&](int k) {
    return PartialState<Cfg>(params, tile * splits + k, Cfg::kSharedRows ? shared.part : warpgroup, thread);
  };
  float o[kCombineSliceCols / 2];
#pragma unroll
  for (int i = 0; i < kCombineSliceCols / 2; ++i) o[i] = 0.f;
  OnlineSoftmax s(Cfg::kPLog2Offset, Cfg::kStaleLog2);  // row_max: the merged reference (-inf); row_sum: l (0)
  if (holds_stored_rows(warpgroup, f, first_position, w.head, params.packing, seqlen_q)) {
    const int first_group = Cfg::kSharedRows ? shared.first_group : slice * kSliceGroups;
    // The first batch of states goes out first, the references of the states past it beside it,
    // so that up to 2 x kCombineBatch states cost one round trip to the L2 before the sums.
    CombineBatch<kSliceGroups> batch;
    batch.load(state, 0, states, first_group);
    // (the largest reference is the same whichever states are counted twice: the last state
    // stands in for those past it)
    float2 next_references[kCombineBatch];  // states kCombineBatch .. 2 kCombineBatch - 1
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const float4 x = state(min(kCombineBatch + j, states - 1)).stats();
      next_references[j] = make_float2(x.x, x.y);
    }
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      s.row_max[0] = fmaxf(s.row_max[0], fmaxf(batch.stats[j].x, next_references[j].x));
      s.row_max[1] = fmaxf(s.row_max[1], fmaxf(batch.stats[j].y, next_references[j].y));
    }
#pragma unroll 8
    for (int k = 2 * kCombineBatch; k < states; ++k) {
      const float4 x = state(k).stats();
      s.row_max[0] = fmaxf(s.row_max[0], x.x);
      s.row_max[1] = fmaxf(s.row_max[1], x.y);
    }
    batch.add(0, states, o, s);
    trace_combine(params, kTraceCombineLoaded);
    for (int k0 = kCombineBatch; k0 < states; k0 += kCombineBatch) {
      batch.load(state, k0, states, first_group);
      batch.add(k0, states, o, s);
    }
  }
  float sink_log2[2], lse[2];
  packed_row_sinks(params, warpgroup, f, first_position, w.head, seqlen_q, sink_log2);
  s.finalize_rows(o, lse, sink_log2[0], sink_log2[1]);
  store_packed_output<Cfg, kCombineSliceCols>(o, lse, params, f, warpgroup, first_position, w.head, w.batch, seqlen_q,
                                              slice * kCombineSliceCols);
  trace_combine(params, kTraceCombineDone);
}

}  // namespace warpattn::detail
