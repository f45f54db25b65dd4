// A consumer warpgroup of the forward kernel above head dim 256 (ForwardConfig::kSplitHeadDim,
// d = 512; docs/headdim512-design.md). Its O would not fit in one warpgroup's registers (64 rows
// x 512 columns is 256 a thread), so both consumer warpgroups take the same 64 query rows and
// each owns half of the head dim: per key tile S_w = Q[:, half w] K[:, half w]ᵀ, a partial sum
// of S over its half; the two meet in shared memory and each adds S_0 + S_1 in that order, so
// both hold the same S bit for bit and run the same softmax (masks, softcap, the precise path)
// on it, with identical P, row references and sums and nothing else exchanged; then O_w += P
// V[:, half w]. The producer, scheduler, masks and epilogue are the forward's (over KV caches
// too: packed rows, split pieces' partial states, each warpgroup's column half); what this file
// adds is the loop, which for now issues each GEMM and waits for it (no overlap of the softmax
// with the GEMMs, no ping-pong: both warpgroups meet at every key tile). The probes
// tools/probes/p_split_head_dim.cu and p_split_head_dim_loop.cu verified the pieces (runs 133,
// 139). No split tail (run_forward plans none for it); a KV cache's split keys leave partial
// states (each warpgroup its column half of the same rows) for combine_kvcache_splits_kernel.
#pragma once

#include "hopper/barriers.hpp"
#include "hopper/consumer.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/split_tail_combine.cuh"

namespace warpattn::detail {

// The S exchange (exchange_buffer): each warpgroup's partial S of one key tile (64 rows x
// kBlockN fp32, row-major).

// S = S_0 + S_1 in place of this warpgroup's partial s: its part written, both read back after
// both have written, and the buffer free again once both have read.
template <class Cfg>
__device__ __forceinline__ void sum_partial_scores(float (&s)[Cfg::kBlockN / 2], float* exchange, int warpgroup,
                                                   const FragmentCoords& f) {
  constexpr int kN = Cfg::kBlockN, kPart = 64 * kN;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) exchange[warpgroup * kPart + f.row(r) * kN + f.col(j, c)] = s[4 * j + 2 * r + c];
  ptx::named_barrier_sync(Barrier::kExchangeWritten, 256);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int at = f.row(r) * kN + f.col(j, c);
        s[4 * j + 2 * r + c] = exchange[at] + exchange[kPart + at];
      }
  ptx::named_barrier_sync(Barrier::kExchangeRead, 256);
}

// One work tile's key tiles for this warpgroup's half (ordinal it: key tile n_end - 1 - it).
// few_keys: P carried in two 16-bit parts (the forward's precise path, ConsumerTile::run_precise).
template <class Cfg>
__device__ __forceinline__ void run_split_head_dim_tile(const ConsumerTile<Cfg>& tile, SharedStorage<Cfg>& ss,
                                                        float* exchange, float (&o)[Cfg::kOCols / 2],
                                                        OnlineSoftmax& softmax, bool few_keys) {
  using namespace ptx;
  using Element = typename Cfg::Element;
  constexpr int kHalfPanels = Cfg::kOCols / 64;  // 64-column panels of the warpgroup's half
  const int w = tile.t.warpgroup;
  const uint32_t q_half = tile.q_rows + w * kHalfPanels * Cfg::kBlockM * 128;
  const uint32_t kv_half = w * kHalfPanels * Cfg::kBlockN * 128;  // within a K or V tile
  for (int it = 0; it < tile.t.n_tiles; ++it) {
    const RingSlot slot = ring_slot<Cfg::kStages>(tile.t.kv_base + it);
    float s[Cfg::kBlockN / 2];
    mbarrier_wait(smem_addr(&ss.k_full[slot.stage]), slot.phase);
    issue_rows_gemm<Element, kHalfPanels, Cfg::kBlockM, Cfg::kBlockN, 128>(s, q_half,
                                                                          smem_addr(ss.k[slot.stage]) + kv_half);
    wgmma_commit();
    wgmma_wait<0>();
    pin(s);
    tile.release_scores_operands(it, slot.stage);
    sum_partial_scores<Cfg>(s, exchange, w, tile.f);
    tile.template finish_scores<true>(s, it);
    float alpha[2];
    softmax.step<false>(s, alpha, tile.score_scale(it));  // from the initial -inf max, alpha = 0 and O = 0 stay exact
    rescale_rows(o, alpha);
    const uint32_t v_half = smem_addr(ss.v[slot.stage]) + kv_half;
    mbarrier_wait(smem_addr(&ss.v_full[slot.stage]), slot.phase);
    // (P's registers pinned on both sides of the GEMM, as ConsumerTile::pv_alone and wait_pv
    // do: without that ptxas reuses them under the wgmma and serializes it, C7512)
    if (few_keys) {
      uint32_t hi[Cfg::kPvSteps][4], lo[Cfg::kPvSteps][4];
      convert_to_split_operand<Cfg>(s, hi, lo);
      pin(o), pin(hi), pin(lo);
      wgmma_fence();
      issue_register_gemm<Element, Cfg::kOCols, Cfg::kPvSteps, Cfg::kBlockN * 128>(o, hi, v_half);
      issue_register_gemm<Element, Cfg::kOCols, Cfg::kPvSteps, Cfg::kBlockN * 128>(o, lo, v_half);
      wgmma_commit();
      wgmma_wait<0>();
      pin(o), pin(hi), pin(lo);
    } else {
      uint32_t p[Cfg::kPvSteps][4];
      convert_to_operand<Cfg>(s, p);
      pin(o), pin(p);
      wgmma_fence();
      issue_register_gemm<Element, Cfg::kOCols, Cfg::kPvSteps, Cfg::kBlockN * 128>(o, p, v_half);
      wgmma_commit();
      wgmma_wait<0>();
      pin(o), pin(p);
    }
    release_slot(&ss.v_empty[slot.stage]);
  }
}

// The consumer loop of a split-head-dim kernel: the work tiles as run_consumer_warpgroup
// receives them (dense or packed batches, or KV caches' pieces; no split tail, no FP8), each
// finalized and stored by both warpgroups, each its half of the columns (the lse by warpgroup
// 0), or, for a piece of a KV cache's split keys, left as its partial state (state part w:
// warpgroup w's columns of the tile's 64 shared rows).
template <class Cfg>
__device__ __forceinline__ void run_split_head_dim_consumer(SharedStorage<Cfg>& ss, const ForwardParams& params,
                                                            int warpgroup) {
  static_assert(Cfg::kSplitHeadDim && Cfg::kSharedRows && !Cfg::kFp8,
                "the 16-bit forward: dense, packed or over KV caches");
  float* exchange = exchange_buffer(ss);
  const FragmentCoords f(threadIdx.x % 128);
  int kv = 0, q_iter = 0;  // as in the producer
  for (int i = 0;; ++i) {
    // (A KV cache's pieces carry their partial state's slot, as in run_consumer_warpgroup.)
    const ScheduledTile w =
        ss.tiles.template receive<(!Cfg::kCausal && !Cfg::kVarlen) || Cfg::kKvCache, Cfg::kVarlen>(i);
    if (w.is_end()) break;
    // The tile's sequence: a packed batch's (a KV cache's) own, or the launch's.
    const int seqlen_q = Cfg::kVarlen ? w.seqlen_q : params.seqlen_q;
    const int seqlen_k = Cfg::kVarlen ? w.seqlen_k : params.seqlen_k;
    float o[Cfg::kOCols / 2];
#pragma unroll
    for (int j = 0; j < Cfg::kOCols / 2; ++j) o[j] = 0.f;
    OnlineSoftmax softmax(Cfg::kPLog2Offset, Cfg::kStaleLog2);
    if (w.n_tiles > 0) {
      const RingSlot qs = ring_slot<Cfg::kQStages>(q_iter);
      const TileContext t{warpgroup, w.m_block, w.head, w.batch, w.n_tiles, w.n_end, kv, qs.stage, seqlen_q, seqlen_k};
      ptx::mbarrier_wait(ptx::smem_addr(&ss.q_full[qs.stage]), qs.phase);
      const ConsumerTile<Cfg> tile(ss, params, t);
      bool few_keys;
      if constexpr (Cfg::kKvCache)  // a block of positions, or the 64-row prefill block its first lies in
        few_keys = kvcache_sees_few_keys(first_row_of_block<Cfg>(w.m_block, params), rows_of_block<Cfg>(params),
                                         seqlen_q, seqlen_k, Cfg::kCausal ? params.band : KeyBand{}, Cfg::kBlockM);
      else
        few_keys = sees_few_keys(w.m_block * Cfg::kBlockM, Cfg::kBlockM, seqlen_q, seqlen_k,
                                 Cfg::kCausal ? params.band : KeyBand{});
      run_split_head_dim_tile<Cfg>(tile, ss, exchange, o, softmax, few_keys);
      kv += w.n_tiles;
      ++q_iter;
    }
    float lse[2];
    if constexpr (Cfg::kKvCache) {
      // Packed rows (GQA), each its own query head; both warpgroups hold the tile's rows 0-63
      // (row warpgroup 0 for where they go), warpgroup w the columns from w kOCols.
      const int first_position = first_row_of_block<Cfg>(w.m_block, params);
      if (w.piece >= 0) {  // a piece of the tile's keys: its partial state, part w of the slot
        if (holds_stored_rows(0, f, first_position, w.head, params.packing, seqlen_q))
          PartialState<Cfg>(params, w.piece, warpgroup, threadIdx.x % 128).store(o, softmax);
        continue;
      }
      float sink_log2[2];
      packed_row_sinks(params, 0, f, first_position, w.head, seqlen_q, sink_log2);
      softmax.finalize_rows(o, lse, sink_log2[0], sink_log2[1]);
      // Both warpgroups' lse are the same bits; warpgroup 0's goes out (first_col 0).
      store_packed_output<Cfg, Cfg::kOCols>(o, lse, params, f, 0, first_position, w.head, w.batch, seqlen_q,
                                            warpgroup * Cfg::kOCols);
      continue;
    }
    const float sink_log2 = params.sinks != nullptr ? params.sinks[w.head * params.sinks_stride] * static_cast<float>(kLog2e)
                                                  : -INFINITY;
    softmax.finalize(o, lse, sink_log2);
    // Both warpgroups' lse are the same bits; warpgroup 0's goes out (first_col 0).
    store_output<Cfg, Cfg::kOCols>(o, lse, params, f, 0, w.m_block, w.head, w.batch, Cfg::kVarlen ? w.q_offset : 0,
                                   seqlen_q, warpgroup * Cfg::kOCols);
  }
}

}  // namespace warpattn::detail
