// The backward's preprocess: per query row, the terms every key block needs, and the zeroed dQ
// accumulator.
//   D = rowsum(dO ∘ O)   (dS = P ∘ (dP − D): D is the softmax's part of each row's gradient)
//   LSE · log2(e)        so that P = exp2(S · scale · log2(e) − LSE_log2), one FFMA + EX2;
//                        +inf for a row without keys (forward LSE −inf) and for padding rows
//                        past seqlen_q, which makes P exactly 0 there without a mask
#pragma once
#include <cmath>
#include <cstdint>

#include "hopper/backward/backward_params.hpp"
#include "hopper/backward/workspace.hpp"
#include "hopper/log2e.hpp"
#include "hopper/ptx/math.cuh"
#include "hopper/varlen/varlen_tiles.hpp"

namespace warpattn::detail {

// The kRows (64; the transposed dQ conversion's: its kBlockM) workspace rows of a row kernel's
// CTA (grid (rows / kRows, heads_q, batch); a packed batch: (padded rows / kRows, heads_q, 1)):
// where they are and which rows of the tensors they stand for. kGranule: the workspace's
// (backward_row_granule), a multiple of kRows, so a block lies within one sequence's rows.
struct RowBlock {
  int batch;         // the tensors' batch index (a packed batch's: 0)
  int64_t first;     // the block's first workspace row, this head's
  int row_block;     // the block within its sequence: rows row_block x kRows ..
  int q_offset;      // the sequence's first row in the tensors
  int seqlen_q;      // rows past it are padding
};

template <int kRows = 64, int kGranule = 128>
__device__ __forceinline__ RowBlock row_block_of(const BackwardParams& p) {
  static_assert(kGranule % kRows == 0, "a block within one sequence's padded rows");
  const int head = blockIdx.y;
  if (p.cu_seqlens_q != nullptr) {
    const int64_t padded = static_cast<int64_t>(blockIdx.x) * kRows;
    const int lo = sequence_of_padded_row<kGranule>(p.cu_seqlens_q, p.batch, p.seqlen_q, padded);
    const int off = clamp_int(p.cu_seqlens_q[lo], 0, p.seqlen_q), end = clamp_int(p.cu_seqlens_q[lo + 1], off, p.seqlen_q);
    return {0, padded + static_cast<int64_t>(head) * p.rows,
            static_cast<int>((padded - varlen_row0<kGranule>(off, lo)) / kRows), off, end - off};
  }
  const int batch = blockIdx.z;
  return {batch, (static_cast<int64_t>(batch) * p.heads_q + head) * p.rows + blockIdx.x * kRows,
          static_cast<int>(blockIdx.x), 0, p.seqlen_q};
}

// The sinks' gradient, this block's part (threads 0..63: its rows, after D and LSE_log2 are in
// the workspace): dsink_h = -sum_i exp(sink_h - LSE_i) D_i, for the rows of the sequence. Summed
// over the block in a fixed order, into sink_sums[head][block], the block's place among every
// sequence's blocks of the head (gridDim.z x gridDim.x of them).
__device__ __forceinline__ void add_sink_terms(const BackwardParams& p, const RowBlock& rb, int64_t first, int head) {
  __shared__ float warp_sums[2];
  __syncthreads();  // D of every row of the block written
  if (threadIdx.x < 64) {
    const int row = rb.row_block * 64 + threadIdx.x;
    float term = 0.f;
    if (row < rb.seqlen_q) {
      const float sink_log2 = p.sinks[head * p.sinks_stride] * static_cast<float>(kLog2e);
      term = -ptx::exp2_approx(sink_log2 - p.lse_log2[first + threadIdx.x]) * p.row_d[first + threadIdx.x];
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) term += __shfl_xor_sync(0xffffffffu, term, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = term;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    p.sink_sums[static_cast<int64_t>(head) * gridDim.z * gridDim.x + static_cast<int64_t>(blockIdx.z) * gridDim.x +
                blockIdx.x] = warp_sums[0] + warp_sums[1];
}

// dsinks[h] = the sum of head h's `count` block parts (add_sink_terms), in a fixed order: one
// CTA per head, each thread a fixed stride of them, then a fixed tree. count 0: zeros.
// (A template, like the other row kernels, so that each backward_<dtype>_d<dim>.cu has its own.)
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(256) reduce_sink_sums_kernel(const __grid_constant__ BackwardParams p, int64_t count) {
  __shared__ float sums[256];
  const int head = blockIdx.x;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < count; i += 256) sum += p.sink_sums[head * count + i];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int half = 128; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsinks[head * p.dsinks_stride] = sums[0];
}

// One 64-row block of one (sequence, head), 256 threads.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(256) backward_row_terms_kernel(const __grid_constant__ BackwardParams p) {
  const RowBlock rb = row_block_of<64, backward_row_granule(kHeadDim)>(p);
  const int head = blockIdx.y, batch = rb.batch, row_block = rb.row_block;
  const int64_t first = rb.first;
  // D: kLanes threads per row, 8 elements (16 bytes) each, kGroups of them (a row's kHeadDim / 8
  // groups over at most a warp's 32 lanes: two each at d = 512), summed with shuffles.
  constexpr int kLanes = kHeadDim / 8 < 32 ? kHeadDim / 8 : 32;
  constexpr int kGroups = kHeadDim / 8 / kLanes;
  static_assert(kLanes <= 32 && 256 % kLanes == 0 && kGroups * kLanes * 8 == kHeadDim, "a row's lanes sit in one warp");
  constexpr int kRowsPerPass = 256 / kLanes;
  const int lane = threadIdx.x % kLanes;
  // The main kernel's tail split counters (two a cut tile), zeroed before it runs.
  if (p.tail_counters != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
    for (int i = threadIdx.x; i < 2 * p.tail.split_tiles; i += 256) p.tail_counters[i] = 0;
  for (int r0 = 0; r0 < 64; r0 += kRowsPerPass) {
    const int r = r0 + threadIdx.x / kLanes;
    const int row = row_block * 64 + r;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
      const int group = lane + k * kLanes;
      if (row < rb.seqlen_q && 8 * group < p.head_dim_v) {  // a padded head dim: its 16-byte groups only
        const uint4 a = reinterpret_cast<const uint4*>(p.dout.row<const Element>(batch, rb.q_offset + row, head))[group];
        const uint4 b = reinterpret_cast<const uint4*>(p.out.row<const Element>(batch, rb.q_offset + row, head))[group];
        const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 x = ptx::unpack_pair<Element>(aw[i]), y = ptx::unpack_pair<Element>(bw[i]);
          sum = fmaf(x.x, y.x, fmaf(x.y, y.y, sum));
        }
      }
    }
#pragma unroll
    for (int o = kLanes / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) p.row_d[first + r] = sum;
  }
  if (threadIdx.x < 64) {
    const int row = row_block * 64 + threadIdx.x;
    float l = INFINITY;
    if (row < rb.seqlen_q) {
      const float lse = p.lse[batch * p.lse_stride_batch + head * p.lse_stride_head +
                              static_cast<int64_t>(rb.q_offset + row) * p.lse_stride_row];
      l = lse == -INFINITY ? INFINITY : lse * static_cast<float>(kLog2e);
    }
    p.lse_log2[first + threadIdx.x] = l;
  }
  if (p.sinks != nullptr) add_sink_terms(p, rb, first, head);
  float4* acc = reinterpret_cast<float4*>(p.dq_accum + first * kHeadDim);
  for (int e = threadIdx.x; e < 64 * kHeadDim / 4; e += blockDim.x) acc[e] = make_float4(0.f, 0.f, 0.f, 0.f);
  // The deterministic turns: block 0 of each (sequence, head) zeroes every counter of its rows
  // (p.rows of them a head: 64 rows a counter, 32 at d = 512), since an 80-row kernel numbers
  // its counters by 80-row blocks over the same array (backward_dq_writer.cuh) and the grid may
  // stop short of the padded rows (run_backward: the rows the main kernel covers).
  constexpr int kTurnRows = backward_turn_rows(kHeadDim);
  if (p.turns != nullptr && blockIdx.x == 0) {
    for (int64_t i = threadIdx.x; i < p.rows / kTurnRows; i += blockDim.x) p.turns[first / kTurnRows + i] = 0;
  }
}

}  // namespace warpattn::detail
