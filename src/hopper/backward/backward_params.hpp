// Runtime arguments of the backward's three kernels (preprocess, main, dQ conversion).
#pragma once
#include <cstdint>

#include "hopper/backward/tail_split.hpp"
#include "hopper/kv_tiles.hpp"

namespace warpattn::detail {

struct VarlenTile;  // varlen/varlen_tiles.hpp

// A (batch, seqlen, heads, head_dim) tensor's rows: strides in elements, head_dim contiguous.
struct RowsView {
  void* data = nullptr;
  int64_t stride_batch = 0, stride_row = 0, stride_head = 0;
#ifdef __CUDACC__
  template <class T>
  __device__ __forceinline__ T* row(int batch, int row, int head) const {
    return static_cast<T*>(data) + batch * stride_batch + row * stride_row + head * stride_head;
  }
#endif
};

// Head dims whose backward kernel has a softcap: at d = 64 (128-row query blocks, S and dP in 128
// registers) the tanh's derivative spilled; a softcap at head dims 64 or less runs in the 128
// kernel instead (BackwardProblem::backward_kernel_dim).
template <int kHeadDim>
inline constexpr bool kBackwardHasSoftcap = kHeadDim >= 128;

struct BackwardParams {
  RowsView dout, out, dq, dk, dv;
  const float* lse = nullptr;  // (B, Hq, Sq)
  int64_t lse_stride_batch = 0, lse_stride_head = 0, lse_stride_row = 0;
  // The workspace (backward/workspace.hpp): [B][Hq][rows] per query row, dq_accum x head_dim.
  float* dq_accum = nullptr;
  float* row_d = nullptr;
  float* lse_log2 = nullptr;
  int* turns = nullptr;  // deterministic mode only
  int batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0;
  // The tensors' head dims, q and k's and v's (which may differ): kHeadDim, or less for one
  // between compiled ones (panel_tile.cuh). The dQ accumulator keeps kHeadDim columns; dQ and
  // dK get head_dim, dV head_dim_v; D = rowsum(dO o O) reads head_dim_v.
  int head_dim = 0, head_dim_v = 0;
  // The workspace's rows per (batch, head): seqlen_q rounded up to
  // BackwardWorkspaceLayout::kRowAlign; a packed batch's: its padded rows (one (batch) of them).
  int rows = 0;
  // Packed variable-length batches: the plan's key-block tiles[0 .. *tile_count) (null: dense),
  // and the query offsets for the row kernels (backward/workspace.hpp's padded layout). batch is
  // then the number of sequences, seqlen_q and seqlen_k the packed lengths.
  const VarlenTile* varlen_tiles = nullptr;
  const int* varlen_tile_count = nullptr;
  const int* cu_seqlens_q = nullptr;
  int kv_group = 1;  // query heads per KV head
  float scale_log2 = 0;     // softmax_scale · log2(e)
  float softmax_scale = 0;  // dK's and dQ's factor
  // The banded kernels' (Cfg::kCausal: causal or a sliding window) keys per row (kv_tiles.hpp).
  KeyBand band;
  // The banded kernels' launch order without the deterministic mode (key_block_work.hpp's
  // grouped_longest_first): its groups of (batch, KV head) rows; 0: the grid's own order.
  int longest_first_groups = 0;
  // The tail split (tail_split.hpp; tail.split_tiles 0: none, and the grid is 3-D): the launch's
  // tiles in a 1-D grid of tail.ctas(tail_tiles) CTAs, the cut tiles' partial dK and dV
  // (tail_fixup.cuh: parts - 1 slots a cut tile) and two counters a cut tile, which the row
  // terms kernel zeroes.
  TailSplit tail;
  int tail_tiles = 0;
  float* tail_partials = nullptr;
  int* tail_counters = nullptr;
  // Softcap (0: off): as ForwardParams' softcap_ex2, and 1 / (softcap log2(e)).
  float softcap_ex2 = 0, softcap_inv_log2 = 0;
  // What takes the scores (softcapped: their tanh) to P's exponent: scale_log2, or softcap log2(e).
  float probability_log2 = 0;
  // Sinks (or null): their logits, and the workspace's per-64-row-block parts of each head's
  // gradient ([Hq][row blocks of every sequence], row_terms.cuh), summed into dsinks at the end.
  const float* sinks = nullptr;
  int64_t sinks_stride = 1;
  float* sink_sums = nullptr;
  float* dsinks = nullptr;
  int64_t dsinks_stride = 1;
};

}  // namespace warpattn::detail
