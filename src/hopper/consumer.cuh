// A consumer warpgroup: 64 query rows of every work tile the CTA gets, against every visible
// key tile.
//
// Overlaps (FlashAttention-3, sections 3.1 and 3.2, and across work tiles):
//  * intra-warpgroup: S_j = Q·K_jᵀ is issued together with O += P_{j-1}·V_{j-1}; the softmax
//    of S_j runs while the P·V GEMM is still on the tensor cores;
//  * across work tiles: a tile's last P·V is issued with the next tile's first S GEMM, and
//    its epilogue runs while the next tile's softmax has started, so short tiles (small N)
//    keep the tensor cores as busy as long ones;
//  * ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named barriers),
//    so one warpgroup's softmax and epilogue run under the other's GEMMs.
// Key tiles are visited from the last to the first, so the masked ones (the seqlen_k tail and
// the causal diagonal) come first and the rest run without mask code.
#pragma once

#include "hopper/barriers.hpp"
#include "hopper/consumer_gemms.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/fragment.cuh"
#include "hopper/kv_tiles.hpp"
#include "hopper/mask.cuh"
#include "hopper/producer.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/shared_storage.cuh"
#include "hopper/softmax.cuh"
#include "hopper/tile_scheduler.cuh"

namespace warpattn::detail {

// Ping-pong turns. Both consumer warpgroups of a CTA take the same number of turns over the
// kernel's life. Warpgroup 1 hands warpgroup 0 the first turn once (start); warpgroup 0
// takes one extra turn at exit (finish) to consume the last hand-over, so no arrival is left
// pending, whatever the number of tiles.
struct PingPong {
  int warpgroup;
  __device__ __forceinline__ void wait_turn() const {
    ptx::named_barrier_sync(Barrier::kTurn0 + warpgroup, 256);
  }
  __device__ __forceinline__ void pass_turn() const {
    ptx::named_barrier_arrive(Barrier::kTurn0 + (warpgroup ^ 1), 256);
  }
  __device__ __forceinline__ void start() const {
    if (warpgroup == 1) pass_turn();
  }
  __device__ __forceinline__ void finish() const {
    if (warpgroup == 0) wait_turn();
  }
};

// One elected thread per warpgroup releases a ring slot once the warpgroup's wgmma reading it
// has completed (empty barriers count one arrival per consumer warpgroup).
__device__ __forceinline__ void release_slot(uint64_t* empty_bar) {
  if (threadIdx.x % 128 == 0) ptx::mbarrier_arrive(ptx::smem_addr(empty_bar));
}

// A work tile whose last P·V has not been issued yet: what that P·V and the epilogue need.
struct PendingTile {
  WorkTile w;
  int v_ordinal;   // K/V ring ordinal of its last key tile
  int accumulate;  // 0 when that P·V is also its first (one key tile): O starts afresh
  OnlineSoftmax softmax;
};

template <class Cfg>
struct ConsumerWarpgroup {
  static constexpr int kS = Cfg::kBlockN / 2;
  static constexpr int kO = Cfg::kHeadDim / 2;
  using POperand = uint32_t[Cfg::kBlockN / 16][4];

  SharedStorage<Cfg>& ss;
  const ForwardParams& params;
  const int warpgroup;
  const FragmentCoords f;
  const PingPong turns;

  __device__ __forceinline__ ConsumerWarpgroup(SharedStorage<Cfg>& ss_, const ForwardParams& p, int wg)
      : ss(ss_), params(p), warpgroup(wg), f(threadIdx.x % 128), turns{wg} {}

  __device__ __forceinline__ uint32_t q_rows(int q_stage) const {
    return ptx::smem_addr(ss.q[q_stage]) + warpgroup * 64 * 128;
  }
  __device__ __forceinline__ int row0(int m_block) const {
    return m_block * Cfg::kBlockM + warpgroup * 64 + f.row(0);
  }
  __device__ __forceinline__ void mask_if_needed(float (&s)[kS], int m_block, int n) const {
    if (kv_tile_needs_mask(n, Cfg::kBlockN, m_block * Cfg::kBlockM, params.seqlen_q,
                           params.seqlen_k, Cfg::kCausal))
      mask_scores<Cfg::kCausal>(s, f, row0(m_block), n * Cfg::kBlockN, params.seqlen_q,
                                params.seqlen_k);
  }
  __device__ __forceinline__ void finish_tile(float (&o)[kO], OnlineSoftmax& softmax, const WorkTile& w) const {
    float lse[2];
    softmax.finalize(o, lse);
    store_output<Cfg>(o, lse, params, f, warpgroup, w.m_block, w.head, w.batch);
  }
  __device__ __forceinline__ void wait_k(int ordinal) const {
    const RingSlot ks = ring_slot<Cfg::kStages>(ordinal);
    ptx::mbarrier_wait(ptx::smem_addr(&ss.k_full[ks.stage]), ks.phase);
  }
  __device__ __forceinline__ void wait_v(int ordinal) const {
    const RingSlot vs = ring_slot<Cfg::kStages>(ordinal);
    ptx::mbarrier_wait(ptx::smem_addr(&ss.v_full[vs.stage]), vs.phase);
  }
  __device__ __forceinline__ uint32_t k_tile(int ordinal) const {
    return ptx::smem_addr(ss.k[ring_slot<Cfg::kStages>(ordinal).stage]);
  }
  __device__ __forceinline__ uint32_t v_tile(int ordinal) const {
    return ptx::smem_addr(ss.v[ring_slot<Cfg::kStages>(ordinal).stage]);
  }
  // After the S GEMM of K/V ordinal `ordinal` has completed: free its K slot, and after a
  // tile's last S GEMM also its Q buffer.
  __device__ __forceinline__ void release_k(int ordinal, bool last, int q_stage) const {
    release_slot(&ss.k_empty[ring_slot<Cfg::kStages>(ordinal).stage]);
    if (last) release_slot(&ss.q_empty[q_stage]);
  }
  __device__ __forceinline__ void release_v(int ordinal) const {
    release_slot(&ss.v_empty[ring_slot<Cfg::kStages>(ordinal).stage]);
  }

  // Issues the pending tile's last P·V on its own (one turn), then its epilogue.
  __device__ __forceinline__ void drain(float (&o)[kO], POperand& p, PendingTile& pending) const {
    using namespace ptx;
    turns.wait_turn();
    wait_v(pending.v_ordinal);
    pin(o);
    pin(p);
    issue_pv_gemm<Cfg>(o, p, v_tile(pending.v_ordinal), pending.accumulate);
    wgmma_commit();
    turns.pass_turn();
    wgmma_wait<0>();
    pin(o);
    release_v(pending.v_ordinal);
    finish_tile(o, pending.softmax, pending.w);
  }

  // The first key tile of a work tile: S only, or (with a pending tile) S together with the
  // pending tile's last P·V, whose epilogue then runs after this tile's softmax.
  template <bool kWithPending>
  __device__ __forceinline__ void first_key_tile(float (&o)[kO], float (&s)[kS], POperand& p,
                                                 PendingTile& pending, OnlineSoftmax& softmax,
                                                 const WorkTile& w, int n_tiles, int kv_base,
                                                 int q_stage) const {
    using namespace ptx;
    float alpha[2];
    turns.wait_turn();
    wait_k(kv_base);
    pin(o);
    pin(p);
    issue_qk_gemm<Cfg>(s, q_rows(q_stage), k_tile(kv_base));
    wgmma_commit();
    if constexpr (kWithPending) {
      wait_v(pending.v_ordinal);
      issue_pv_gemm<Cfg>(o, p, v_tile(pending.v_ordinal), pending.accumulate);
      wgmma_commit();
    }
    turns.pass_turn();
    if constexpr (kWithPending)
      wgmma_wait<1>();
    else
      wgmma_wait<0>();
    pin(s);
    release_k(kv_base, n_tiles == 1, q_stage);
    mask_if_needed(s, w.m_block, n_tiles - 1);
    softmax.step<true>(s, alpha);
    if constexpr (kWithPending) {
      wgmma_wait<0>();
      pin(o);
      pin(p);
      release_v(pending.v_ordinal);
      finish_tile(o, pending.softmax, pending.w);
    }
    convert_to_operand<Cfg>(s, p);
  }

  // One work tile with the overlapped pipeline; leaves its own last P·V pending.
  __device__ __forceinline__ void overlapped_tile(float (&o)[kO], POperand& p, PendingTile& pending,
                                                  bool has_pending, const WorkTile& w, int n_tiles,
                                                  int kv_base, int q_stage) const {
    using namespace ptx;
    OnlineSoftmax softmax(params.scale_log2);
    float s[kS];
    float alpha[2];
    if constexpr (!Cfg::kOverlapTiles) {
#pragma unroll
      for (int i = 0; i < kO; ++i) o[i] = 0.f;  // outside any wgmma pipeline stage
    }
    if constexpr (Cfg::kOverlapTiles) {
      if (has_pending) {
        first_key_tile<true>(o, s, p, pending, softmax, w, n_tiles, kv_base, q_stage);
      } else {
        first_key_tile<false>(o, s, p, pending, softmax, w, n_tiles, kv_base, q_stage);
      }
    } else {
      first_key_tile<false>(o, s, p, pending, softmax, w, n_tiles, kv_base, q_stage);
    }

    // Steady state: S_it with P_{it-1}·V_{it-1}; the first P·V of the tile starts O afresh.
    for (int it = 1; it < n_tiles; ++it) {
      const int k_ord = kv_base + it, v_ord = kv_base + it - 1;
      turns.wait_turn();
      wait_k(k_ord);
      pin(o);
      pin(p);
      issue_qk_gemm<Cfg>(s, q_rows(q_stage), k_tile(k_ord));
      wgmma_commit();
      wait_v(v_ord);
      issue_pv_gemm<Cfg>(o, p, v_tile(v_ord), Cfg::kOverlapTiles ? it > 1 : 1);
      wgmma_commit();
      turns.pass_turn();

      wgmma_wait<1>();  // S_it is done; P·V may still run
      pin(s);
      release_k(k_ord, it == n_tiles - 1, q_stage);
      mask_if_needed(s, w.m_block, n_tiles - 1 - it);
      softmax.step<false>(s, alpha);

      wgmma_wait<0>();  // P·V done: O and P may be touched again
      pin(o);
      pin(p);
      release_v(v_ord);
      rescale_rows(o, alpha);
      convert_to_operand<Cfg>(s, p);
    }
    pending.w = w;
    pending.v_ordinal = kv_base + n_tiles - 1;
    pending.accumulate = Cfg::kOverlapTiles ? n_tiles > 1 : 1;
    pending.softmax = softmax;
  }

  // A work tile with P carried in two 16-bit parts and no overlap inside the warpgroup. Used
  // for the query blocks whose rows see few keys (the start of a causal sequence, short key
  // sequences): there each output row is an average of few V rows, so rounding P to bf16
  // (2^-9 relative) would show directly in O, while these tiles are too short for the overlap
  // to matter. Two turns per key tile; the epilogue follows.
  __device__ __forceinline__ void precise_tile(float (&o)[kO], const WorkTile& w, int n_tiles,
                                               int kv_base, int q_stage) const {
    using namespace ptx;
    OnlineSoftmax softmax(params.scale_log2);
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
    for (int it = 0; it < n_tiles; ++it) {
      const RingSlot slot = ring_slot<Cfg::kStages>(kv_base + it);
      float s[kS];
      turns.wait_turn();
      mbarrier_wait(smem_addr(&ss.k_full[slot.stage]), slot.phase);
      issue_qk_gemm<Cfg>(s, q_rows(q_stage), smem_addr(ss.k[slot.stage]));
      wgmma_commit();
      turns.pass_turn();
      wgmma_wait<0>();
      pin(s);
      release_slot(&ss.k_empty[slot.stage]);
      if (it == n_tiles - 1) release_slot(&ss.q_empty[q_stage]);
      mask_if_needed(s, w.m_block, n_tiles - 1 - it);
      float alpha[2];
      softmax.step<false>(s, alpha);  // from the initial -inf max, alpha = 0 and O = 0 stay exact
      rescale_rows(o, alpha);
      uint32_t hi[Cfg::kBlockN / 16][4], lo[Cfg::kBlockN / 16][4];
      convert_to_split_operand<Cfg>(s, hi, lo);

      turns.wait_turn();
      mbarrier_wait(smem_addr(&ss.v_full[slot.stage]), slot.phase);
      pin(o);
      pin(hi);
      pin(lo);
      issue_pv_gemm<Cfg>(o, hi, smem_addr(ss.v[slot.stage]));
      issue_pv_gemm<Cfg>(o, lo, smem_addr(ss.v[slot.stage]));
      wgmma_commit();
      turns.pass_turn();
      wgmma_wait<0>();
      pin(o);
      release_slot(&ss.v_empty[slot.stage]);
    }
    finish_tile(o, softmax, w);
  }

  // Every work tile the producer publishes, until the end marker.
  __device__ __forceinline__ void run() const {
    float o[kO];
    uint32_t p[Cfg::kBlockN / 16][4];
    PendingTile pending{{0, 0, 0}, 0, 0, OnlineSoftmax(params.scale_log2)};
    bool has_pending = false;
    int kv = 0, q_iter = 0;  // as in the producer
    const int total = total_tiles(params);
    turns.start();
    for (int i = 0;; ++i) {
      const int tile = ss.tiles.receive(i);
      if (tile >= total) break;
      const WorkTile w = tile_coords(tile, params);
      const int n_tiles = kv_tile_count(w.m_block, Cfg::kBlockM, Cfg::kBlockN, params.seqlen_q,
                                        params.seqlen_k, Cfg::kCausal);
      const bool precise =
          n_tiles > 0 && sees_few_keys(w.m_block * Cfg::kBlockM, params.seqlen_q, params.seqlen_k, Cfg::kCausal);
      if (has_pending && (n_tiles == 0 || precise)) {
        drain(o, p, pending);
        has_pending = false;
      }
      if (n_tiles == 0) {  // no visible key: O = 0, LSE = -inf
        OnlineSoftmax empty(params.scale_log2);
#pragma unroll
        for (int j = 0; j < kO; ++j) o[j] = 0.f;
        finish_tile(o, empty, w);
        continue;
      }
      const RingSlot qs = ring_slot<Cfg::kQStages>(q_iter);
      ptx::mbarrier_wait(ptx::smem_addr(&ss.q_full[qs.stage]), qs.phase);
      if (precise) {
        precise_tile(o, w, n_tiles, kv, qs.stage);
      } else {
        overlapped_tile(o, p, pending, has_pending, w, n_tiles, kv, qs.stage);
        has_pending = true;
        if constexpr (!Cfg::kOverlapTiles) {  // no registers to spare: finish the tile now
          drain(o, p, pending);
          has_pending = false;
        }
      }
      kv += n_tiles;
      ++q_iter;
    }
    if (has_pending) drain(o, p, pending);
    turns.finish();
  }
};

}  // namespace warpattn::detail
