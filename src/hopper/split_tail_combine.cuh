// The split tail's partial states (split_tail.hpp) and the kernel that combines them.
//
// A consumer warpgroup that ran a piece of a tail tile stores, per thread, what finalize would
// have taken: O unnormalised (head_dim / 2 floats), its two rows' references R (log2 units)
// and its share of their row sums. Slot 2c + i holds piece i of CTA c's range. float4s,
// thread-major per group of four ([group][thread]): each warp writes and reads 512 contiguous
// bytes, and the combine reads them back by the same thread index, so it never needs the
// fragment's rows and columns.
//
// combine_split_tail_kernel runs after the forward kernel on the same stream (the launch
// boundary orders the stores): one CTA of 128 threads per (tail tile, consumer warpgroup)
// adds up the tile's pieces in CTA order, then finalizes and stores like the forward
// kernel's epilogue. Kept out of the forward kernel, whose consumers have no registers left
// for it (ptxas spilled in the main loop of BF16 d = 128 and FP8 d = 256 with it inside).
#pragma once

#include "hopper/epilogue.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/fragment.cuh"
#include "hopper/ptx/math.cuh"
#include "hopper/softmax.cuh"
#include "hopper/tile_order.hpp"

namespace warpattn::detail {

template <class Cfg>
struct PartialState {
  static constexpr int kGroups = Cfg::kOCols / 8 + 1;  // O's float4s, then {R0, R1, l0, l1}
  static constexpr int kWarpgroupFloats = kGroups * 128 * 4;
  static constexpr size_t kSlotBytes = size_t(kWarpgroupFloats) * Cfg::kConsumerWarpgroups * sizeof(float);
  // Bytes of workspace a grid of `ctas` needs: two slots per CTA.
  static constexpr size_t bytes(int ctas) { return 2 * size_t(ctas) * kSlotBytes; }

  float4* at;  // this warpgroup's part of a slot, offset to the thread
  __device__ __forceinline__ PartialState(const ForwardParams& p, int slot, int warpgroup, int thread)
      : at(reinterpret_cast<float4*>(p.partials + (size_t(slot) * Cfg::kConsumerWarpgroups + warpgroup) * kWarpgroupFloats) +
           thread) {}

  __device__ __forceinline__ void store(const float (&o)[Cfg::kOCols / 2], const OnlineSoftmax& s) const {
#pragma unroll
    for (int g = 0; g < kGroups - 1; ++g) at[g * 128] = make_float4(o[4 * g], o[4 * g + 1], o[4 * g + 2], o[4 * g + 3]);
    at[(kGroups - 1) * 128] = make_float4(s.row_max[0], s.row_max[1], s.row_sum[0], s.row_sum[1]);
  }

  // The state's parts, for a combine that reads them in its own order
  // (decode/combine_splits.cuh): {R0, R1, l0, l1}, and O's float4 group g (fragment registers
  // 4g .. 4g + 3).
  __device__ __forceinline__ float4 stats() const { return at[(kGroups - 1) * 128]; }
  __device__ __forceinline__ float4 group(int g) const { return at[g * 128]; }

  // Adds this state into (o, s): both to the larger reference, 2^(R - R_max) each (0 for a
  // state that saw no key, R = -inf). Fragment registers 4j + 2r and 4j + 2r + 1 are row r's.
  __device__ __forceinline__ void add_to(float (&o)[Cfg::kOCols / 2], OnlineSoftmax& s) const {
    const float4 x = stats();
    const float r_there[2] = {x.x, x.y}, l_there[2] = {x.z, x.w};
    float w_here[2], w_there[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float r_max = fmaxf(s.row_max[r], r_there[r]);
      w_here[r] = s.row_max[r] == -INFINITY ? 0.f : ptx::exp2_approx(s.row_max[r] - r_max);
      w_there[r] = r_there[r] == -INFINITY ? 0.f : ptx::exp2_approx(r_there[r] - r_max);
      s.row_sum[r] = fmaf(s.row_sum[r], w_here[r], l_there[r] * w_there[r]);
      s.row_max[r] = r_max;
    }
#pragma unroll
    for (int g = 0; g < kGroups - 1; ++g) {
      const float4 v = group(g);
      o[4 * g] = fmaf(o[4 * g], w_here[0], v.x * w_there[0]);
      o[4 * g + 1] = fmaf(o[4 * g + 1], w_here[0], v.y * w_there[0]);
      o[4 * g + 2] = fmaf(o[4 * g + 2], w_here[1], v.z * w_there[1]);
      o[4 * g + 3] = fmaf(o[4 * g + 3], w_here[1], v.w * w_there[1]);
    }
  }
};

// Grid (tail tiles, consumer warpgroups), 128 threads: the tile's pieces in CTA order (the
// same sums in the same order every launch), then the forward kernel's epilogue.
template <class Cfg>
__global__ void __launch_bounds__(128) combine_split_tail_kernel(const __grid_constant__ ForwardParams params) {
  const SplitTail& st = params.split;
  const int tail = static_cast<int>(blockIdx.x), warpgroup = static_cast<int>(blockIdx.y);
  const int thread = static_cast<int>(threadIdx.x);
  float o[Cfg::kOCols / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kOCols / 2; ++i) o[i] = 0.f;
  OnlineSoftmax s(Cfg::kPLog2Offset, Cfg::kStaleLog2);
  for (int c = st.first_cta(tail); c <= st.last_cta(tail); ++c)
    if (st.has_range(c)) PartialState<Cfg>(params, st.slot(c, tail), warpgroup, thread).add_to(o, s);
  float lse[2];
  s.finalize(o, lse);
  const WorkTile w = tile_coords(st.first_tile + tail, params);
  store_output<Cfg>(o, lse, params, FragmentCoords(thread), warpgroup, w.m_block, w.head, w.batch, 0, params.seqlen_q);
}

}  // namespace warpattn::detail
