// Epilogue of a consumer warpgroup: its 64 normalised O rows go from registers straight to
// global memory in 16-byte stores (rows past seqlen_q are skipped) and LSE goes out per row.
// first_row: the sequence's first row in out and lse (a packed batch's offset; 0 otherwise).
// Writing from registers leaves the Q buffer free as soon as the last S GEMM has read it, so
// the producer can load the next tile's Q while this epilogue runs. The backward stores dK and
// dV the same way (store_accumulator_row).
#pragma once
#include <cstdint>

#include "hopper/forward_params.hpp"
#include "hopper/fragment.cuh"
#include "hopper/log2e.hpp"
#include "hopper/ptx/math.cuh"

namespace warpattn::detail {

// Row r (0 or 1) of a thread's slice of an m64nN f32 accumulator (N = kCols), as 16-bit values
// in 16-byte stores at `dst`, the row's first element; nothing is stored when dst is null (the
// shuffles still run: they need the whole warp). A quad holds a row as 4-byte pairs (lane q:
// columns 8j + 2q, 8j + 2q + 1). Transposed across the quad, four groups j at a time, lane q
// gets the 16 contiguous bytes of group 4a + q: a quarter of the store instructions, each
// writing whole 16-byte pieces. Only the columns before `cols` are written (a head dim between
// compiled ones: panel_tile.cuh; a multiple of 8, so each 16-byte piece is wholly in or out).
template <class Out, int kCols>
__device__ __forceinline__ void store_accumulator_row(const float (&acc)[kCols / 2], int r, int quad, Out* dst,
                                                      int cols = kCols) {
  uint32_t pieces[kCols / 32][4];
#pragma unroll
  for (int a = 0; a < kCols / 32; ++a) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 4 * a + k;
      pieces[a][k] = ptx::pack_pair<Out>(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
    }
    quad_transpose(pieces[a], quad);
  }
  if (dst == nullptr) return;
  uint4* out_row = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int a = 0; a < kCols / 32; ++a)  // group 4a + q: columns 8 (4a + q) ... + 7
    if (8 * (4 * a + quad) < cols)
      out_row[4 * a + quad] = make_uint4(pieces[a][0], pieces[a][1], pieces[a][2], pieces[a][3]);
}

// kCols columns from first_col (a split head dim's warpgroup: its half; lse with the first).
// warpgroup: whose 64 rows of the tile (a split head dim's warpgroups share rows 0-63: 0).
template <class Cfg, int kCols = Cfg::kOCols>
__device__ __forceinline__ void store_output(const float (&o)[kCols / 2], const float (&lse)[2],
                                             const ForwardParams& params, const FragmentCoords& f,
                                             int warpgroup, int m_block, int head, int batch, int first_row,
                                             int seqlen_q, int first_col = 0) {
  using Out = typename Cfg::OutElement;
  const int row_start = m_block * Cfg::kBlockM + warpgroup * 64;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int seq_row = row_start + f.row(r);
    const int64_t row = first_row + seq_row;  // in the tensor: a packed batch's rows follow its offset
    Out* out_row = seq_row < seqlen_q ? static_cast<Out*>(params.out) + batch * params.out_stride_batch +
                                            row * params.out_stride_row + head * params.out_stride_head
                                      : nullptr;
    // (FP8's head dims are compiled ones: no run-time bound, which spilled its d = 256 kernel)
    store_accumulator_row<Out, kCols>(o, r, f.quad, out_row == nullptr ? nullptr : out_row + first_col,
                                      Cfg::kFp8 ? kCols : params.head_dim - first_col);
    if (params.lse != nullptr && f.quad == 0 && out_row != nullptr && first_col == 0)
      params.lse[batch * params.lse_stride_batch + head * params.lse_stride_head +
                 row * params.lse_stride_row] = lse[r];
  }
}

// A KV cache's packed tile (decode_plan.hpp, GqaPacking): row r of the tile is position
// first_position + r / packing.heads of query head chunk x packing.heads + r % packing.heads;
// rows past positions x heads, and positions past seqlen_q, are not written.
struct PackedRowPlace {
  int position, head;
  bool stored;
};
__device__ __forceinline__ PackedRowPlace packed_row_place(int tile_row, int first_position, int chunk,
                                                           const GqaPacking& packing, int seqlen_q) {
  const PackedRow pr = packed_row(tile_row, packing.heads);
  const int position = first_position + pr.position;
  return {position, chunk * packing.heads + pr.head_in_group,
          pr.position < packing.positions && position < seqlen_q};
}

// The sinks (log2 units; -inf: none) of this thread's two rows' own query heads.
__device__ __forceinline__ void packed_row_sinks(const ForwardParams& params, int warpgroup, const FragmentCoords& f,
                                                 int first_position, int chunk, int seqlen_q, float (&sink_log2)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sink_log2[r] = -INFINITY;
    if (params.sinks == nullptr) continue;
    const int head = packed_row_place(warpgroup * 64 + f.row(r), first_position, chunk, params.packing, seqlen_q).head;
    sink_log2[r] = params.sinks[head * params.sinks_stride] * static_cast<float>(kLog2e);
  }
}

// Whether either of this thread's rows is stored (the partial states of split keys are kept
// and combined for those threads only).
__device__ __forceinline__ bool holds_stored_rows(int warpgroup, const FragmentCoords& f, int first_position, int chunk,
                                                  const GqaPacking& packing, int seqlen_q) {
  return packed_row_place(warpgroup * 64 + f.row(0), first_position, chunk, packing, seqlen_q).stored ||
         packed_row_place(warpgroup * 64 + f.row(1), first_position, chunk, packing, seqlen_q).stored;
}

// kCols columns from first_col (the split combine's slices; a multiple of 32): lse with the first.
template <class Cfg, int kCols = Cfg::kOCols>
__device__ __forceinline__ void store_packed_output(const float (&o)[kCols / 2], const float (&lse)[2],
                                                    const ForwardParams& params, const FragmentCoords& f,
                                                    int warpgroup, int first_position, int chunk, int batch,
                                                    int seqlen_q, int first_col = 0) {
  using Out = typename Cfg::OutElement;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const PackedRowPlace at =
        packed_row_place(warpgroup * 64 + f.row(r), first_position, chunk, params.packing, seqlen_q);
    Out* out_row = at.stored ? static_cast<Out*>(params.out) + batch * params.out_stride_batch +
                                   static_cast<int64_t>(at.position) * params.out_stride_row +
                                   static_cast<int64_t>(at.head) * params.out_stride_head
                             : nullptr;
    store_accumulator_row<Out, kCols>(o, r, f.quad, out_row == nullptr ? nullptr : out_row + first_col,
                                      params.head_dim - first_col);
    if (params.lse != nullptr && f.quad == 0 && out_row != nullptr && first_col == 0)
      params.lse[batch * params.lse_stride_batch + at.head * params.lse_stride_head +
                 static_cast<int64_t>(at.position) * params.lse_stride_row] = lse[r];
  }
}

}  // namespace warpattn::detail
