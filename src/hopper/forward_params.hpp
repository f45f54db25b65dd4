// Runtime arguments of the forward kernel besides its tensor maps.
#pragma once
#include <cstdint>

#include "hopper/split_tail.hpp"

namespace warpattn::detail {

// FP8 descales per (batch, head, block of 128 rows/keys); strides in elements (the block
// stride may be 0: one descale per head).
struct DescaleArray {
  const float* data = nullptr;
  int64_t stride[3] = {0, 0, 0};
#ifdef __CUDACC__
  __device__ __forceinline__ const float& at(int batch, int head, int block) const {
    return data[batch * stride[0] + head * stride[1] + block * stride[2]];
  }
#endif
};

struct VarlenTile;  // varlen/varlen_tiles.hpp

struct ForwardParams {
  void* out = nullptr;  // (B, Sq, Hq, D), 16-bit; strides in elements
  int64_t out_stride_batch = 0, out_stride_row = 0, out_stride_head = 0;
  float* lse = nullptr;  // optional (B, Hq, Sq) fp32
  int64_t lse_stride_batch = 0, lse_stride_head = 0, lse_stride_row = 0;
  int batch = 0, heads_q = 0, seqlen_q = 0, seqlen_k = 0;
  int kv_group = 1;      // query heads per key/value head (GQA)
  int m_blocks = 0;      // query blocks per (batch, head)
  int chunk_heads = 1;   // (batch, head) pairs whose K/V the scheduler keeps in L2 together
  float scale_log2 = 0;  // softmax_scale * log2(e): one FFMA + EX2 per score
  int* tile_counter = nullptr;  // [next tile, CTAs done], zero at launch; null: static order
  // The split tail (split_tail.hpp; split.tiles == 0: every tile whole) and its partial
  // states, 2 x grid slots of kConsumerWarpgroups x 128 threads x (head_dim / 2 + 4) floats.
  SplitTail split;
  float* partials = nullptr;
  DescaleArray q_descale, k_descale, v_descale;  // FP8 only
  // Packed variable-length batches (Cfg::kVarlen): the plan's tiles[0 .. *tile_count)
  // (varlen/plan_varlen.hpp). batch is then the number of sequences, seqlen_q and seqlen_k the
  // packed lengths, and out/lse rows are indexed from each sequence's offset (batch strides 0).
  const VarlenTile* varlen_tiles = nullptr;
  const int* varlen_tile_count = nullptr;
  // Always 0, unknown to ptxas (ptx::schedule_fence). One per fence of a basic block chain
  // (ptxas drops a second branch on a value it has already branched on); the main loop has one.
  uint32_t opaque_zero[1] = {0};
};

}  // namespace warpattn::detail
