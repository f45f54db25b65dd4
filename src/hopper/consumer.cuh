// A consumer warpgroup's main loop for one work tile: 64 query rows against every visible
// key tile.
//
// Two overlaps (FlashAttention-3, sections 3.1 and 3.2):
//  * intra-warpgroup: S_j = Q·K_jᵀ is issued together with O += P_{j-1}·V_{j-1}; the softmax
//    of S_j runs while the P·V GEMM is still on the tensor cores;
//  * ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named barriers),
//    so one warpgroup's softmax runs under the other's GEMMs.
// Key tiles are visited from the last to the first, so the masked ones (the seqlen_k tail and
// the causal diagonal) come first and the rest run without mask code.
#pragma once

#include "hopper/barriers.hpp"
#include "hopper/consumer_gemms.cuh"
#include "hopper/decode/lean_cache_producer.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/fragment.cuh"
#include "hopper/kv_tiles.hpp"
#include "hopper/mask.cuh"
#include "hopper/producer.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/shared_storage.cuh"
#include "hopper/softcap.cuh"
#include "hopper/softmax.cuh"

namespace warpattn::detail {

// Whether each consumer warpgroup visits only the key tiles its own 64 rows see
// (warpgroup_key_tiles), taking part in the others' turns and ring slots without their work
// (skip_key_tiles): on a window the block's band is wider than a warpgroup's by the other
// warpgroups' rows, and a KV cache's decode tile holds its few real rows in warpgroup 0.
// Run 183 (BF16 N = 16K causal, windows 4096/1024/256, 3 interleaved passes beside cuDNN's
// sliding window): d = 256 (80-key tiles) +3.3/+4.5/+6.2%, causal +2.7%; d = 64's tall tiles
// (112 keys) +2.6/+6.4%, causal +1.5%; the E4M3 KV cache's decode at B = 64 201 -> 185 us,
// BF16's at B = 8 54.0 -> 52.6. Where key tiles are 128 keys on 128-row blocks, each
// warpgroup's band covers its block's tiles (causal, windows of 2^k keys, Sq = Sk): d = 128
// came within +-1.5%, and d = 64's 128 x 128 banded kernel 5.7% slower on the 256-key window
// (the same work; the schedule around it moved). So 1 (the default) takes it in the banded
// kernels whose key tiles are not a multiple of 128 keys and in the KV caches, the other
// kernels' code staying as it was; 2 in every banded or packed kernel (to measure); 0 nowhere.
// Never on a split head dim (both warpgroups on the same rows).
#ifndef WARPATTN_TUNE_WARPGROUP_KEY_TILES
#define WARPATTN_TUNE_WARPGROUP_KEY_TILES 1
#endif
template <class Cfg>
inline constexpr bool kWarpgroupKeyTiles =
    !Cfg::kSplitHeadDim &&
    (WARPATTN_TUNE_WARPGROUP_KEY_TILES == 2 ? Cfg::kCausal || Cfg::kVarlen
     : WARPATTN_TUNE_WARPGROUP_KEY_TILES == 1 ? Cfg::kKvCache || (Cfg::kCausal && Cfg::kBlockN % 128 != 0)
                                              : false);
// Ping-pong turns, in a ring 0 -> 1 (-> 2) -> 0. Every consumer warpgroup of a CTA takes the
// same number of turns over the kernel's life. The last warpgroup hands warpgroup 0 the first
// turn once (start); warpgroup 0 takes one extra turn at exit (finish) to consume the last
// hand-over, so no arrival is left pending, whatever the number of tiles.
struct PingPong {
  int warpgroup, warpgroups;
  int next;  // the warpgroup whose turn follows this one's
  __device__ __forceinline__ PingPong(int warpgroup_, int warpgroups_)
      : warpgroup(warpgroup_), warpgroups(warpgroups_), next(warpgroup_ + 1 == warpgroups_ ? 0 : warpgroup_ + 1) {}
  __device__ __forceinline__ void wait_turn() const { ptx::named_barrier_sync(Barrier::kTurn0 + warpgroup, 256); }
  __device__ __forceinline__ void pass_turn() const { ptx::named_barrier_arrive(Barrier::kTurn0 + next, 256); }
  __device__ __forceinline__ void start() const {
    if (warpgroup == warpgroups - 1) pass_turn();
  }
  __device__ __forceinline__ void finish() const {
    if (warpgroup == 0) wait_turn();
  }
};

// What a consumer needs to know about the work tile it is on.
struct TileContext {
  int warpgroup;
  int m_block, head, batch;
  int n_tiles;  // key tiles to visit (> 0): n_end - 1 down to n_end - n_tiles
  int n_end;
  int kv_base;  // K/V ring ordinal of this tile's first key tile
  int q_stage;  // Q buffer
  int seqlen_q, seqlen_k;  // of the tile's sequence
  // FP8: the descale blocks of the sequence's first query row and key (a packed batch's padded
  // blocks, quantize_fp8_varlen; 0 otherwise).
  int q_block0 = 0, k_block0 = 0;
};

// One elected thread per warpgroup releases a ring slot once the warpgroup's wgmma reading it
// has completed (empty barriers count one arrival per consumer warpgroup).
__device__ __forceinline__ void release_slot(uint64_t* empty_bar) {
  if (threadIdx.x % 128 == 0) ptx::mbarrier_arrive(ptx::smem_addr(empty_bar));
}

template <class Cfg>
struct ConsumerTile {
  SharedStorage<Cfg>& ss;
  const ForwardParams& params;
  const TileContext& t;
  const FragmentCoords f;
  const PingPong turns;
  // The warpgroup's 64 rows within the tile (a split head dim's two warpgroups share rows 0-63).
  static constexpr bool kSharedRows = Cfg::kSplitHeadDim;
  // The tile's first query row and its row count (a KV cache's: positions, packing.positions),
  // and the query rows of this thread's register halves (row1: a KV cache's packed positions
  // only; otherwise the second half's row is row0 + 8, mask_scores).
  int m_start, block_rows, row0, row1;  // (set in the constructor's body for a KV cache)
  // The rows whose band decides which key tiles need a mask: the warpgroup's own 64
  // (kWarpgroupKeyTiles<Cfg>), or the tile's (a KV cache's packed positions, a shared-rows split).
  int mask_m_start, mask_rows;
  const uint32_t q_rows;
  const float q_scale;  // softmax_scale log2(e), times Q's descale for FP8
  // FP8: the K and V descales of the work tile's last key tile (ordinal 0); the tile of
  // ordinal it is stride[2] x it before it: one address per key tile, not three 64-bit products.
  const float *k_descale_last, *v_descale_last;
  // An E4M3 cache at d = 256 (the kernels of decode/lean_cache_producer.cuh): O, S and P in
  // flight leave its 240 registers with no room for the thread index read again to elect the
  // warpgroup's releasing thread, or for the 64 column indices of a mask. There a slot is
  // released by the lane elect.sync picks in the warpgroup's first warp (first_warp: read once,
  // through a broadcast, so a uniform register), and the mask compares constants against bounds
  // taken from the thread's first column (mask_scores' kThreadCols). Without both, ptxas spilled
  // one value in the main loop (4 bytes, not banded) or one at each tile and in the window's
  // left-edge loop (banded).
  static constexpr bool kLeanRegisters = kLeanCacheProducer<Cfg>;
  bool first_warp;  // (kLeanRegisters only)

  __device__ __forceinline__ ConsumerTile(SharedStorage<Cfg>& ss_, const ForwardParams& p,
                                          const TileContext& t_)
      : ss(ss_),
        params(p),
        t(t_),
        f(threadIdx.x % 128),
        turns{t_.warpgroup, Cfg::kConsumerWarpgroups},
        m_start(t_.m_block * Cfg::kBlockM),
        block_rows(Cfg::kBlockM),
        row0(t_.m_block * Cfg::kBlockM + (kSharedRows ? 0 : t_.warpgroup) * 64 + f.row(0)),
        row1(0),
        mask_m_start(t_.m_block * Cfg::kBlockM + (kWarpgroupKeyTiles<Cfg> && !kSharedRows ? t_.warpgroup * 64 : 0)),
        mask_rows(kWarpgroupKeyTiles<Cfg> && !kSharedRows ? 64 : Cfg::kBlockM),
        q_rows(ptx::smem_addr(ss_.q[t_.q_stage]) + (kSharedRows ? 0 : t_.warpgroup) * 64 * Cfg::kSwizzleBytes),
        q_scale(Cfg::kFp8 ? p.scale_log2 * p.q_descale.at(t_.batch, t_.head,
                                                           t_.q_block0 + (m_start + t_.warpgroup * 64) / Cfg::kDescaleRows)
                          : p.scale_log2),
        k_descale_last(Cfg::kFp8 ? &p.k_descale.at(t_.batch, t_.head / p.kv_group, t_.k_block0 + t_.n_end - 1) : nullptr),
        v_descale_last(Cfg::kFp8 ? &p.v_descale.at(t_.batch, t_.head / p.kv_group, t_.k_block0 + t_.n_end - 1) : nullptr) {
    if constexpr (Cfg::kKvCache) {  // packed rows (decode_plan.hpp): positions, each row's own
      m_start = first_row_of_block<Cfg>(t_.m_block, p);
      block_rows = rows_of_block<Cfg>(p);
      const int rows_from = (kSharedRows ? 0 : t_.warpgroup) * 64;
      row0 = m_start + (rows_from + f.row(0)) / p.packing.heads;
      row1 = m_start + (rows_from + f.row(1)) / p.packing.heads;
      mask_m_start = m_start, mask_rows = block_rows;
    }
    if constexpr (kLeanRegisters) first_warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x % 128) / 32, 0) == 0;
  }

  // The key tile visited at ordinal it (the last first).
  __device__ __forceinline__ int key_tile(int it) const { return t.n_end - 1 - it; }

  // Scores of the key tile of ordinal it to log2 units: with FP8, times the tile's K descale;
  // softcapped scores (tanh of the scaled score, softcap_scores) times softcap log2(e).
  __device__ __forceinline__ float score_scale(int it) const {
    if constexpr (Cfg::kFp8)
      return q_scale * k_descale_last[-it * params.k_descale.stride[2]];
    else
      return params.softcap_ex2 != 0.f ? params.softcap_log2 : q_scale;
  }
  // FP8: V's descale of ordinal it, as the softmax takes it (log2 into P's exponent, and its
  // inverse for the row sum); {0, 1} otherwise.
  struct VTerms {
    float log2, inv;
  };
  __device__ __forceinline__ VTerms v_terms(int it) const {
    if constexpr (Cfg::kFp8) {
      const float v = v_descale_last[-it * params.v_descale.stride[2]];
      return {ptx::log2_approx(v), __fdividef(1.f, v)};
    } else {
      return {0.f, 1.f};
    }
  }

  // The band (params.band) exists only in the banded kernels (Cfg::kCausal: causal or a
  // sliding window); the others bound keys by seqlen_k alone.
  __device__ __forceinline__ KeyBand band() const { return Cfg::kCausal ? params.band : KeyBand{}; }
  __device__ __forceinline__ MaskedTiles masked() const {
    return masked_tiles(mask_m_start, mask_rows, Cfg::kBlockN, t.seqlen_q, t.seqlen_k, band());
  }
  // kLeftEdge: the tile may lie on a window's left edge (see run: never in the main loop).
  template <bool kLeftEdge>
  __device__ __forceinline__ void mask_if_needed(float (&s)[Cfg::kBlockN / 2], int n) const {
    const MaskedTiles m = masked();
    if (kLeftEdge ? m.needs(n) : n >= m.right_from)
      mask_scores<Cfg::kCausal, kLeftEdge && Cfg::kCausal, Cfg::kBlockN / 2, kLeanRegisters>(
          s, f, row0, n * Cfg::kBlockN, t.seqlen_q, t.seqlen_k, band(), Cfg::kKvCache ? row1 : -1);
  }
  // How many of the tile's key tiles, the last visited, lie on a window's left edge.
  __device__ __forceinline__ int left_edge_tiles() const {
    if constexpr (!Cfg::kCausal) return 0;
    const int n = masked().left_below - (t.n_end - t.n_tiles);
    return n < 0 ? 0 : (n > t.n_tiles ? t.n_tiles : n);
  }
  // After the S GEMM of key tile `it` has completed: free its K slot (and after the tile's last
  // S GEMM also the Q buffer), lift INT8 scores to floats, softcap them (16-bit only: before the
  // mask, whose -inf tanh would turn into -1), mask where the tile needs it.
  template <bool kLeftEdge = true>
  __device__ __forceinline__ void scores_done(float (&s)[Cfg::kBlockN / 2], int it, int stage) const {
    release_scores_operands(it, stage);
    finish_scores<kLeftEdge>(s, it);
  }
  // scores_done's two halves (a split head dim sums its partial S between them).
  __device__ __forceinline__ void release_scores_operands(int it, int stage) const {
    release(&ss.k_empty[stage]);
    if (it == t.n_tiles - 1) release(&ss.q_empty[t.q_stage]);
  }
  template <bool kLeftEdge = true>
  __device__ __forceinline__ void finish_scores(float (&s)[Cfg::kBlockN / 2], int it) const {
    if constexpr (Cfg::kIntScores) lift_int_scores(s);
    if constexpr (!Cfg::kFp8)
      if (params.softcap_ex2 != 0.f) softcap_scores<true>(s, params.softcap_ex2);
    mask_if_needed<kLeftEdge>(s, key_tile(it));
  }

  // The masked scores of key tile `it` from an S GEMM issued alone in its own turn (nothing to
  // overlap it with: a tile's first key tile, or the precise path).
  __device__ __forceinline__ void scores_alone(float (&s)[Cfg::kBlockN / 2], int it) const {
    using namespace ptx;
    const RingSlot ks = ring_slot<Cfg::kStages>(t.kv_base + it);
    turns.wait_turn();
    mbarrier_wait(smem_addr(&ss.k_full[ks.stage]), ks.phase);
    issue_qk_gemm<Cfg>(s, q_rows, smem_addr(ss.k[ks.stage]));
    wgmma_commit();
    turns.pass_turn();
    wgmma_wait<0>();
    pin(s);
    scores_done(s, it, ks.stage);
  }

  // O += P·V for key tile slot `vs`, issued alone in its own turn and waited for; P given as
  // one or more operand parts (the precise path's hi and lo) summed by the same GEMM group.
  template <class... Parts>
  __device__ __forceinline__ void pv_alone(float (&o)[Cfg::kOCols / 2], RingSlot vs, Parts&... parts) const {
    using namespace ptx;
    turns.wait_turn();
    mbarrier_wait(smem_addr(&ss.v_full[vs.stage]), vs.phase);
    pin(o);
    (pin(parts), ...);
    (issue_pv_gemm<Cfg>(o, parts, smem_addr(ss.v[vs.stage])), ...);
    wgmma_commit();
    turns.pass_turn();
    wait_pv(o, vs);
  }

  // After the P·V GEMM of slot vs: O (and the P operands given) may be touched again, the V
  // slot is free.
  template <class... Parts>
  __device__ __forceinline__ void wait_pv(float (&o)[Cfg::kOCols / 2], RingSlot vs, Parts&... parts) const {
    ptx::wgmma_wait<0>();
    ptx::pin(o);
    (ptx::pin(parts), ...);
    release(&ss.v_empty[vs.stage]);
  }
  // release_slot, or (kLeanRegisters) from the lane elect.sync picks in the warpgroup's first
  // warp (the whole warpgroup calls it).
  __device__ __forceinline__ void release(uint64_t* empty_bar) const {
    if constexpr (kLeanRegisters) {
      const bool elected = ptx::elect_one();
      if (first_warp && elected) ptx::mbarrier_arrive(ptx::smem_addr(empty_bar));
    } else {
      release_slot(empty_bar);
    }
  }

  // Issues S_it = Q·K_itᵀ and O += P·V of the previous key tile (it - 1) in this warpgroup's
  // turn; returns V's slot.
  __device__ __forceinline__ RingSlot issue_step(float (&o)[Cfg::kOCols / 2], uint32_t (&p)[Cfg::kPvSteps][4],
                                                 float (&s)[Cfg::kBlockN / 2], int it, RingSlot ks) const {
    using namespace ptx;
    const RingSlot vs = ring_slot<Cfg::kStages>(t.kv_base + it - 1);
    turns.wait_turn();
    mbarrier_wait(smem_addr(&ss.k_full[ks.stage]), ks.phase);
    pin(o);
    pin(p);
    issue_qk_gemm<Cfg>(s, q_rows, smem_addr(ss.k[ks.stage]));
    wgmma_commit();
    mbarrier_wait(smem_addr(&ss.v_full[vs.stage]), vs.phase);
    issue_pv_gemm<Cfg>(o, p, smem_addr(ss.v[vs.stage]));
    wgmma_commit();
    turns.pass_turn();
    return vs;
  }

  // The overlapped main loop (FlashAttention-3's intra-warpgroup pipeline), then the key tiles
  // on a sliding window's left edge, if any: those come last (tiles are visited downwards) and
  // wait for their P·V before their mask, whose per-row bounds do not fit in registers beside
  // O, P and S in flight at d = 256 (the main loop masks the right edge only).
  __device__ __forceinline__ void run(float (&o)[Cfg::kOCols / 2], OnlineSoftmax& softmax) const {
    using namespace ptx;
    float s[Cfg::kBlockN / 2];
    uint32_t p[Cfg::kPvSteps][4];
    float alpha[2];

    // First key tile: S only.
    scores_alone(s, 0);
    const VTerms v0 = v_terms(0);
    softmax.step<true, Cfg::kIntScores>(s, alpha, score_scale(0), v0.log2, v0.inv);
    convert_to_operand<Cfg>(s, p);

    // Steady state: S_it with P_{it-1}·V_{it-1}. FP8's descales of tile it are loaded before
    // the GEMMs are issued, so their latency hides under them (a load after the wgmma wait
    // would stall the softmax).
    const int left_edge = t.n_tiles - left_edge_tiles();
    for (int it = 1; it < left_edge; ++it) {
      const float c = score_scale(it);
      const VTerms v = v_terms(it);
      const RingSlot ks = ring_slot<Cfg::kStages>(t.kv_base + it);
      const RingSlot vs = issue_step(o, p, s, it, ks);

      wgmma_wait<1>();  // S_it is done; P·V may still run
      pin(s);
      scores_done<false>(s, it, ks.stage);
      if constexpr (Cfg::kSoftmaxRowsThenConvert) {
        // Cfg::kSoftmaxRowsThenConvert: the fence keeps the P·V wait below the first row's
        // exponentials and the second row's max; the first row's conversion then shares a
        // block with the second row's exponentials.
        softmax.update_row_max<false, Cfg::kIntScores>(s, 0, alpha, c, v.log2);
        softmax.exponentiate_row<false>(s, 0, alpha, v.inv);
        softmax.update_row_max<false, Cfg::kIntScores>(s, 1, alpha, c, v.log2);
        schedule_fence(params.opaque_zero[0]);
        wait_pv(o, vs, p);
        convert_to_operand<Cfg, 0>(s, p);
        softmax.exponentiate_row<false>(s, 1, alpha, v.inv);
        convert_to_operand<Cfg, 1>(s, p);
      } else {
        softmax.step<false, Cfg::kIntScores>(s, alpha, c, v.log2, v.inv);
        wait_pv(o, vs, p);  // hoisted above the softmax by ptxas (d = 64: ForwardConfig)
        convert_to_operand<Cfg>(s, p);
      }
      // Last: its branch ends the block, and the conversion of P belongs with the exponentials.
      rescale_if_needed(o, alpha);
    }
    if constexpr (Cfg::kCausal) {
      for (int it = left_edge > 1 ? left_edge : 1; it < t.n_tiles; ++it) {
        const float c = score_scale(it);
        const VTerms v = v_terms(it);
        const RingSlot ks = ring_slot<Cfg::kStages>(t.kv_base + it);
        const RingSlot vs = issue_step(o, p, s, it, ks);
        wait_pv(o, vs, p);  // S_it and P_{it-1}·V_{it-1} done: P's registers are free
        pin(s);
        scores_done<true>(s, it, ks.stage);
        softmax.step<false, Cfg::kIntScores>(s, alpha, c, v.log2, v.inv);
        convert_to_operand<Cfg>(s, p);
        rescale_if_needed(o, alpha);
      }
    }

    // Last P·V.
    pv_alone(o, ring_slot<Cfg::kStages>(t.kv_base + t.n_tiles - 1), p);
  }

  // The same attention with P carried in two 16-bit parts and no overlap inside the
  // warpgroup. Used for the query blocks whose rows see few keys (the start of a causal
  // sequence, short key sequences): there each output row is an average of few V rows, so
  // rounding P to bf16 (2^-9 relative) would show directly in O, while these tiles are too
  // short for the overlap to matter. Two turns per key tile.
  __device__ __forceinline__ void run_precise(float (&o)[Cfg::kOCols / 2], OnlineSoftmax& softmax) const {
    using namespace ptx;
    for (int it = 0; it < t.n_tiles; ++it) {
      const RingSlot slot = ring_slot<Cfg::kStages>(t.kv_base + it);
      float s[Cfg::kBlockN / 2];
      scores_alone(s, it);
      float alpha[2];
      softmax.step<false>(s, alpha, score_scale(it));  // from the initial -inf max, alpha = 0 and O = 0 stay exact
      rescale_rows(o, alpha);
      uint32_t hi[Cfg::kPvSteps][4], lo[Cfg::kPvSteps][4];
      convert_to_split_operand<Cfg>(s, hi, lo);

      pv_alone(o, slot, hi, lo);
    }
  }
};

// A warpgroup's part in the key tiles of its work tile that none of its rows see
// (warpgroup_key_tiles): the ping-pong turn it would have taken for each (ConsumerTile::run
// takes one a key tile and one more for its last P·V; the precise path visits every tile), so
// that the warpgroups' turns stay in step, and the ring slots it would have released, in that
// turn: a warpgroup that held its releases back while the others wait in their turns for a
// tile the producer cannot load before those releases would deadlock them. Each slot only once
// its tile has arrived: the arrival must count toward this use of the slot, which the producer
// starts only after every warpgroup has released the slot's previous use.
template <class Cfg>
__device__ __forceinline__ void skip_key_tiles(SharedStorage<Cfg>& ss, const PingPong& turns, int kv_first, int tiles) {
  using namespace ptx;
  for (int j = 0; j < tiles; ++j) {
    turns.wait_turn();
    turns.pass_turn();
    const RingSlot slot = ring_slot<Cfg::kStages>(kv_first + j);
    mbarrier_wait(smem_addr(&ss.k_full[slot.stage]), slot.phase);
    release_slot(&ss.k_empty[slot.stage]);
    mbarrier_wait(smem_addr(&ss.v_full[slot.stage]), slot.phase);
    release_slot(&ss.v_empty[slot.stage]);
  }
}

}  // namespace warpattn::detail
