// dQ's fp32 accumulator in the workspace, and the kernel that turns it into dQ.
//
// Layout: per (batch, query head), `rows` x head_dim floats in blocks of 64 rows; a block is
// head_dim / 64 pieces of 64 x 64 floats, piece c holding columns 64c .. 64c + 63 in the order
// an m64n64 wgmma accumulator sits in a warpgroup's registers: thread t's d[4j .. 4j + 3] at
// floats 4 (128 j + t) .. + 3. A consumer warpgroup stores its piece to shared memory in that
// order (one 16-byte store per j, consecutive threads at consecutive addresses: no bank
// conflict), and one bulk reduce adds the 16 KB to the piece in global memory.
#pragma once
#include <cstdint>

#include "hopper/backward/backward_params.hpp"
#include "hopper/backward/dq_transposed_layout.hpp"
#include "hopper/backward/row_terms.cuh"
#include "hopper/fragment.cuh"
#include "hopper/ptx/math.cuh"

namespace warpattn::detail {

struct DqAccumLayout {
  static constexpr int kPieceFloats = 64 * 64;
  // First float of piece `piece` of the 64-row block `row_block` of a sequence whose
  // workspace rows start at ws_row0, for query head `head`.
  __device__ __forceinline__ static int64_t piece_offset(const BackwardParams& p, int64_t ws_row0, int head,
                                                         int row_block, int piece, int head_dim) {
    return (ws_row0 + static_cast<int64_t>(head) * p.rows + row_block * 64) * head_dim + piece * kPieceFloats;
  }
  // The transposed kernels' (dq_transposed_layout.hpp): the first float of consumer `piece`'s
  // piece of query block `m_block` (kQueries rows) of the sequence and head.
  template <int kQueries>
  __device__ __forceinline__ static int64_t transposed_piece_offset(const BackwardParams& p, int64_t ws_row0, int head,
                                                                    int m_block, int piece, int head_dim) {
    return (ws_row0 + static_cast<int64_t>(head) * p.rows + static_cast<int64_t>(m_block) * kQueries) * head_dim +
           DqTransposedPiece<kQueries>::piece_float0(piece);
  }
};

// dQ = softmax_scale x the accumulator, in dQ's dtype: one kBlockM-row query block of one
// (sequence, head) per CTA, grid (rows / kBlockM, heads_q, batch) (a packed batch: (padded rows /
// kBlockM, heads_q, 1); kGranule, the workspace's, a multiple of kBlockM), 256 threads. Piece:
// DqTransposedPiece<kBlockM> (Cfg::kDqTransposed) or DqUntransposedPiece (64 rows). A piece's
// floats are not in row order, so they go through shared memory: each thread reads 16-byte
// groups in order (coalesced) and puts their four floats at their rows and columns, then 16-byte
// chunks of the rows go out, scaled and packed, each warp's stores whole rows. (Writing each
// float pair from the fragment straight to dQ, as 4-byte stores spread over 8 rows a warp, took
// 2-2.5x the time of these 16-byte ones at d = 64 and 256: run 229.) Row pitch: the columns plus
// Piece::kRowPad (the transposed pieces: 4, where a warp's 32 stores, rows 2q + c and columns
// 16w + g + 8r of its lanes' fragments, hit 32 banks; 8 more would put lanes q and q + 2 on one).
inline constexpr int kConvertDqThreads = 256;  // convert_dq_kernel's block (run_backward.cuh launches it)
template <class Element, int kHeadDim, int kBlockM, int kGranule, class Piece>
__global__ void __launch_bounds__(kConvertDqThreads) convert_dq_kernel(const __grid_constant__ BackwardParams p) {
  static_assert(kHeadDim % 64 == 0 && kBlockM * kHeadDim == Piece::kFloats * (kHeadDim / 64), "64-column pieces");
  // d = 512 at 32 rows and d = 256 at 64: two passes.
  constexpr int kColumns = dq_conversion_columns(kHeadDim, kBlockM, Piece::kRowPad);
  constexpr int kPasses = kHeadDim / kColumns;
  constexpr int kPitch = kColumns + Piece::kRowPad;  // a multiple of 4: the 16-byte row reads stay aligned
  static_assert(kPitch % 4 == 0 && kBlockM * kPitch * 4 <= 48 * 1024, "the rows in static shared memory");
  __shared__ alignas(16) float rows[kBlockM * kPitch];
  constexpr int kThreads = kConvertDqThreads;
  const RowBlock rb = row_block_of<kBlockM, kGranule>(p);
  const int row_block = rb.row_block, head = blockIdx.y, batch = rb.batch;
#pragma unroll 1
  for (int pass = 0; pass < kPasses; ++pass) {
    const int column0 = pass * kColumns;
    const float4* block = reinterpret_cast<const float4*>(p.dq_accum + rb.first * kHeadDim + kBlockM * column0);
    constexpr int kGroups = kBlockM * kColumns / 4;
    if (pass > 0) __syncthreads();  // the previous pass's rows are out
    // The element map once a thread (ConversionThreadMap: a base and constant offsets), not once
    // a 16-byte group: computed per group (division by the piece size, the accumulator's lane and
    // register bits) it took ~160 instructions a group, ~45M warp instructions a call at B·N =
    // 16K, d = 128, about what the SMs issue in the conversion's 77.6 us (run 272, an H100). Now
    // ten 16-byte loads back to back, then 40 stores with immediate offsets: 73.1 us, and the
    // backward +2.3% at d = 128 N = 1K (3 interleaved passes).
    using Map = ConversionThreadMap<Piece, kThreads, kPitch>;
    constexpr int kLoads = kGroups / kThreads;
    static_assert(kGroups % kThreads == 0 && Map::affine(kLoads), "a thread's base and constant offsets");
    float* const base = rows + Map::address(threadIdx.x, 0, 0);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const float4 v = block[threadIdx.x + kThreads * k];
      base[Map::offset(k, 0)] = v.x;
      base[Map::offset(k, 1)] = v.y;
      base[Map::offset(k, 2)] = v.z;
      base[Map::offset(k, 3)] = v.w;
    }
    __syncthreads();
    constexpr int kChunks = kColumns / 8;  // 16-byte chunks of a 16-bit row
    for (int e = threadIdx.x; e < kBlockM * kChunks; e += blockDim.x) {
      const int r = e / kChunks, col = 8 * (e % kChunks);
      const int row = kBlockM * row_block + r;
      // A padded head dim is a multiple of 8: a chunk is wholly in or out.
      if (row >= rb.seqlen_q || column0 + col >= p.head_dim) continue;
      const float4 a = *reinterpret_cast<const float4*>(rows + r * kPitch + col);
      const float4 b = *reinterpret_cast<const float4*>(rows + r * kPitch + col + 4);
      const float s = p.softmax_scale;
      *reinterpret_cast<uint4*>(p.dq.row<Element>(batch, rb.q_offset + row, head) + column0 + col) =
          make_uint4(ptx::pack_pair<Element>(a.x * s, a.y * s), ptx::pack_pair<Element>(a.z * s, a.w * s),
                     ptx::pack_pair<Element>(b.x * s, b.y * s), ptx::pack_pair<Element>(b.z * s, b.w * s));
    }
  }
}

}  // namespace warpattn::detail
