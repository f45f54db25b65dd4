// Runtime arguments of the forward kernel besides its tensor maps.
#pragma once
#include <cstdint>

#include "hopper/decode/decode_plan.hpp"
#include "hopper/decode/kv_pages.hpp"
#include "hopper/kv_tiles.hpp"
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
  // v's (and O's) head dim: Cfg::kHeadDim, or less for one between compiled ones, or one
  // that differs from q and k's (panel_tile.cuh): only its columns of O are written.
  int head_dim = 0;
  int kv_group = 1;      // query heads per key/value head (GQA)
  int m_blocks = 0;      // query blocks per (batch, head)
  int chunk_heads = 1;   // (batch, head) pairs whose K/V the scheduler keeps in L2 together
  float scale_log2 = 0;  // softmax_scale * log2(e): one FFMA + EX2 per score
  // The banded kernels' (Cfg::kCausal: causal or a sliding window) keys per row (kv_tiles.hpp).
  KeyBand band;
  // Softcap (softcap > 0; 16-bit only): scores become softcap * tanh(scale * s / softcap),
  // computed as tanh(x) = 1 - 2 / (2^(2 log2(e) x) + 1) with softcap_ex2 = 2 log2(e) scale /
  // softcap (0: off), then taken to log2 units by softcap_log2 = softcap * log2(e).
  float softcap_ex2 = 0, softcap_log2 = 0;
  // Attention sinks: one logit per query head (natural log, unscaled) joining every row's
  // softmax denominator, or null. Never with the split tail (its combine has no sink term).
  const float* sinks = nullptr;
  int64_t sinks_stride = 1;
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
  // (Last, so that the fields above keep their offsets in every other kernel.)
  // A KV cache's launch (Cfg::kKvCache; warpattn.hpp, KvCache): where each key tile's boxes
  // are in the cache (decode/kv_pages.hpp). q, out and lse keep their batch axis.
  KvPages kv_pages;
  // ... and how its tiles' rows pack query heads (decode/decode_plan.hpp): work tiles are
  // (block of packing.positions query positions, chunk of packing.heads query heads, sequence);
  // heads_q counts the chunks, kv_group the chunks per KV head, m_blocks the blocks of positions.
  GqaPacking packing;
  // ... and its pieces of work (kv_cache_pieces.hpp): the lengths, the split count, the total.
  KvCacheWork kv_work;
#if WARPATTN_TRACE_KV
  unsigned long long* kv_trace = nullptr;  // decode/kv_trace.cuh (measurement builds only)
#endif
};

}  // namespace warpattn::detail
