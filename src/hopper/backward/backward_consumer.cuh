// A consumer warpgroup of the backward: 64 keys of the CTA's key block, dK and dV for them in
// registers, against every step's query block (FlashAttention-3's backward, section 3 and
// appendix B of its paper; the GEMM forms are docs/backward-design.md's):
//   Sᵀ  = K·Qᵀ, dPᵀ = V·dOᵀ          SS, keys on the M axis, both issued at once
//   Pᵀ  = exp2(Sᵀ·scale·log2e − LSE)  masked where the step needs it
//   dSᵀ = Pᵀ ∘ (dPᵀ − D)
//   dV += Pᵀ·dO, dK += dSᵀ·Q         RS: the accumulators, packed to 16 bits, are the A operands
//   dQ  = dS·K                        SS from shared memory: dSᵀ stored [key][query] is dS read
//                                     MN-major; each consumer makes one 64-column piece
//   (80-row query blocks: dQᵀ = Kᵀ·dSᵀ, SS, Kᵀ read MN-major from K, dS stored [query][key]
//                                     by stmatrix.trans and read K-major; each consumer makes
//                                     the 80 rows of its 64 columns, dq_transposed_layout.hpp)
//   dQ piece handed to a writer warp, which adds it to the fp32 accumulator in global memory
//                                     with one bulk reduce (Cfg::kDqFromRegisters: added by
//                                     the consumer itself, red.global.add.v4.f32)
//   (lagged dQ, Cfg::kLaggedDq: step j's dQ GEMM is issued in step j + 1, so that the consumers
//                                     need not meet every step: docs/backward-design.md)
// d = 64, 128 and 512; d = 256 has its own (backward_consumer_n80.cuh, built on this one).
#pragma once

#include "hopper/backward/backward_dq_writer.cuh"
#include "hopper/backward/backward_params.hpp"
#include "hopper/backward/backward_shared_storage.cuh"
#include "hopper/backward/column_half.cuh"
#include "hopper/backward/dq_accum.cuh"
#include "hopper/backward/key_block_work.hpp"
#include "hopper/backward/key_query_tile.hpp"
#include "hopper/backward/tail_fixup.cuh"
#include "hopper/consumer_gemms.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/fragment.cuh"
#include "hopper/kv_tiles.hpp"
#include "hopper/ptx/math.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/memory_order.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/ptx/wgmma_ops.cuh"
#include "hopper/ring_slot.cuh"
#include "hopper/softcap.cuh"
#include "hopper/transposed_rows.cuh"

namespace warpattn::detail {

template <class Cfg>
struct BackwardConsumer {
  using Element = typename Cfg::Element;
  static constexpr int kM = Cfg::kBlockM, kN = Cfg::kBlockN, kD = Cfg::kHeadDim;
  static constexpr int kKV = Cfg::kKVColumns, kPieces = Cfg::kDqPiecesPerConsumer;
  static constexpr bool kDqT = Cfg::kDqTransposed;
  static constexpr int kDqRegs = Cfg::kDqPieceFloats / 128;  // a dQ piece's registers per thread

  BackwardSharedStorage<Cfg>& ss;
  const BackwardParams& p;
  const KeyBlockWork& work;
  const int warpgroup;
  const FragmentCoords f;
  const int key0;  // this warpgroup's first key (its 64 keys: the CTA's, or a half of them)
  // Row terms (LSE, D) a caller loads ahead of their use (Cfg::kEarlyRowTerms): the pairs of two
  // 8-query groups, one k16 step's.
  static constexpr int kEarlyGroups = 2;
  // LSE pairs loaded before the S GEMM is waited for: every group's with Cfg::kEarlyLse
  // (FlashAttention-3's order: 20 registers at 80 rows), else the first kEarlyGroups'.
  static constexpr int kEarlyLseGroups = Cfg::kEarlyLse ? kM / 8 : kEarlyGroups;

  __device__ __forceinline__ BackwardConsumer(BackwardSharedStorage<Cfg>& ss_, const BackwardParams& p_,
                                              const KeyBlockWork& work_, int warpgroup_)
      : ss(ss_),
        p(p_),
        work(work_),
        warpgroup(warpgroup_),
        f(threadIdx.x % 128),
        key0(work_.n_block * kN + (Cfg::kSplitHeadDim ? 0 : 64 * warpgroup_)) {}

  // This thread's pair of a row term (LSE or D) for its two queries of 8-query group j.
  __device__ __forceinline__ float2 row_pair(const float* terms, int j) const {
    return *reinterpret_cast<const float2*>(terms + f.col(j, 0));
  }
  template <int kCount>
  __device__ __forceinline__ void load_row_pairs(float2 (&pairs)[kCount], const float* terms, int j0 = 0) const {
#pragma unroll
    for (int g = 0; g < kCount; ++g) pairs[g] = row_pair(terms, j0 + g);
  }

  // Pᵀ from Sᵀ in place. Query rows past seqlen_q have LSE_log2 = +inf (P = 0 by itself); keys
  // past seqlen_k (zero-filled by TMA) and outside a query's band (right of the causal diagonal
  // or a window, left of a window) are masked.
  // Softcap: S becomes tanh(scale S / softcap) first (softcap.cuh), then P = 2^(tanh ·
  // softcap log2(e) - LSE log2(e)). q0 is the step's first query.
  // lse_first: with Cfg::kEarlyRowTerms, the first kEarlyLseGroups groups' LSE pairs, loaded by
  // the caller.
  __device__ __forceinline__ void probabilities(float (&s)[kM / 2], int stage, int q0,
                                                const float2 (&lse_first)[kEarlyLseGroups]) const {
    const float* lse = ss.lse_log2[stage];
    if (kBackwardHasSoftcap<kD> && p.softcap_ex2 != 0.f) softcap_scores<false>(s, p.softcap_ex2);
    const float c = p.probability_log2;
#pragma unroll
    for (int j = 0; j < kM / 8; ++j) {
      const float2 l = Cfg::kEarlyRowTerms && j < kEarlyLseGroups ? lse_first[j] : row_pair(lse, j);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s[4 * j + 2 * r] = ptx::exp2_approx(fmaf(s[4 * j + 2 * r], c, -l.x));
        s[4 * j + 2 * r + 1] = ptx::exp2_approx(fmaf(s[4 * j + 2 * r + 1], c, -l.y));
      }
    }
    const KeyBand band = Cfg::kCausal ? p.band : KeyBand{};
    if (!kv_tile_needs_mask(work.n_block, kN, q0, kM, work.seqlen_q, work.seqlen_k, band)) return;
    // Element (j, c) of row half r pairs key key0 + f.row(r) with query q0 + f.col(j, c). Query i
    // sees key k iff -(offset + right) <= i - k <= left - offset (kv_tiles.hpp's band), and
    // i - k = base + e with e = f.col(j, c) - f.row(r) - (f.col(0, 0) - f.row(0)) = 8j + c - 8r,
    // a constant of the element. So three thresholds per thread cover every bound: fewer
    // registers than a bound per row (the d = 64 kernel spilled with those).
    const int offset = work.seqlen_k - work.seqlen_q;
    const int base = q0 - key0 + f.col(0, 0) - f.row(0);
    const int lo = band.right == kUnbounded ? -kM : -(offset + band.right) - base;  // hidden below
    const int hi = band.left == kUnbounded ? kM : band.left - offset - base;       // hidden above
    const int key_end = work.seqlen_k - key0 - f.row(0);  // keys past seqlen_k: 8r >= key_end
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < kM / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int e = 8 * j + c - 8 * r;
          if (8 * r >= key_end || (Cfg::kCausal && (e < lo || e > hi))) s[4 * j + 2 * r + c] = 0.f;
        }
  }

  // dSᵀ = Pᵀ ∘ (dPᵀ − D), in dp's registers; with a softcap also ∘ (1 − tanh²), the tanh's
  // derivative, its tanh recovered from P (log2 P = tanh · softcap log2(e) − LSE log2(e)) rather
  // than kept from probabilities() in kM / 2 more registers. P = 0 (masked, or underflowed, where
  // dS is 0 anyway) would give log2 0 = -inf: the factor is 0 there. The softcap is decided once
  // a call (one branch around the loop), not once an element: per element, its branch was taken 40
  // times a step at d = 128 (run 261's profile: 8x FlashAttention-3's branches) and cut the dS
  // arithmetic into blocks of one element; decided once, the backward was 2-3% faster at d = 128
  // (run 267). (A lambda taking std::bool_constant, tried to share this branch with
  // backward_consumer_n80.cuh, moved ptxas's block layout and registers away from the form measured.)
  // j_begin .. j_end: the 8-query groups to do (all by default; the early dV, one k16 step's two).
  // d_given: with Cfg::kEarlyRowTerms, the D pairs of the range's first two groups, loaded by the
  // caller ahead of this.
  __device__ __forceinline__ void score_gradients(const float (&s)[kM / 2], float (&dp)[kM / 2], int stage,
                                                  int q_stage, const float2 (&d_given)[kEarlyGroups],
                                                  int j_begin = 0, int j_end = kM / 8) const {
    const float* row_d = ss.row_d[stage];
    const float* lse = ss.lse_log2[q_stage];
    const bool capped = kBackwardHasSoftcap<kD> && p.softcap_ex2 != 0.f;
    if (capped) {
      score_gradients_range<true>(s, dp, row_d, lse, d_given, j_begin, j_end);
    } else {
      score_gradients_range<false>(s, dp, row_d, lse, d_given, j_begin, j_end);
    }
  }

  template <bool kCapped>
  __device__ __forceinline__ void score_gradients_range(const float (&s)[kM / 2], float (&dp)[kM / 2],
                                                        const float* row_d, const float* lse,
                                                        const float2 (&d_given)[kEarlyGroups], int j_begin,
                                                        int j_end) const {
#pragma unroll
    for (int j = j_begin; j < j_end; ++j) {
      const float2 d = Cfg::kEarlyRowTerms && j - j_begin < kEarlyGroups ? d_given[j - j_begin] : row_pair(row_d, j);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float prob = s[4 * j + i];
        float g = prob * (dp[4 * j + i] - (i % 2 == 0 ? d.x : d.y));
        if constexpr (kCapped) {
          const float l = lse[f.col(j, i % 2)];
          const float t = (ptx::log2_approx(prob) + l) * p.softcap_inv_log2;
          g *= prob > 0.f ? fmaf(-t, t, 1.f) : 0.f;
        }
        dp[4 * j + i] = g;
      }
    }
  }

  // dS into buffer `buf`: dSᵀ as [key][query] (write_key_query_tile), or with dQ transposed dS
  // as [query][key] (write_ds_transposed).
  __device__ __forceinline__ void write_ds(const uint32_t (&ds)[kM / 16][4], int buf) const {
    if constexpr (kDqT) {
      write_ds_transposed(ds, buf);
    } else {
      write_key_query_tile(ds, ss.ds[buf]);
    }
  }

  // Transposed dQ: dS itself, [query][key], the K-major B operand of dQᵀ = Kᵀ·dSᵀ. This
  // warpgroup's 64 keys are one panel: kM query rows of 128 bytes (panel `warpgroup`, kM x 128
  // bytes on; with the head dim split, d = 512, the CTA's only 64 keys, panel 0), written by
  // store_transposed_rows (transposed_rows.cuh).
  __device__ __forceinline__ void write_ds_transposed(const uint32_t (&ds)[kM / 16][4], int buf) const {
    const int panel = Cfg::kSplitHeadDim ? 0 : warpgroup;
    store_transposed_rows(ptx::smem_addr(ss.ds[buf]) + panel * kM * 128, f.warp, ds);
  }

  // Transposed dQ of this warpgroup's 64 columns: dQᵀ (64 x kM) = Kᵀ·dSᵀ over the CTA's kN keys.
  // A = Kᵀ: K's panel `warpgroup` (its columns 64·warpgroup ..; with the head dim split, d = 512,
  // the panel of piece `piece` of the consumer's columns, consumer_column0 / 64 + piece) read
  // MN-major (tnspA: d contiguous), as the untransposed kernel reads K as B; +16 rows of 128 bytes per k16 step. B =
  // dSᵀ: dS [query][key] read K-major (kM rows of 128 bytes, 8-row groups 1024 bytes apart), 32
  // bytes per k16 step within a panel of 64 keys, the next panel kM x 128 bytes on.
  __device__ __forceinline__ void issue_dq_transposed_gemm(float (&dq)[kDqRegs], int buf, int piece) const {
    using Mma = ptx::WgmmaSSTransposedA<Element, kM>;
    const int panel = Cfg::kSplitHeadDim ? consumer_column0<Cfg>(warpgroup) / 64 + piece : warpgroup;
    const uint32_t a = ptx::smem_addr(ss.k) + panel * kN * 128;
    const uint64_t ad = ptx::make_smem_desc(a, kN * 128, 1024, 128);
    const uint64_t bd = kmajor_desc<128>(ptx::smem_addr(ss.ds[buf]));
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      Mma::mma(dq, advance(ad, kk * 16 * 128), advance(bd, kk / 4 * kM * 128 + kk % 4 * 32), kk > 0);
  }

  // dSᵀ's 16-bit pairs, the step's kM queries, into the [key][query] tile at `base`
  // (key_query_tile.hpp: rows of 128 bytes, 64-query panels kN x 128 bytes apart,
  // 128B-swizzled). A warp's 32 stores hit 32 different banks.
  __device__ __forceinline__ void write_key_query_tile(const uint32_t (&x)[kM / 16][4], uint8_t* base) const {
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = key0 - work.n_block * kN + f.row(i % 2);
        const int j = operand_query_group(kk, i);  // 8-query group
        *reinterpret_cast<uint32_t*>(key_query_tile_pair(base, key, j, f.quad, kN)) = x[kk][i];
      }
  }

  // dQ piece `piece` of this warpgroup = dS·K: at kM = 64 the 64 columns of piece
  // kPieces·warpgroup + piece for all 64 queries (A the whole dS buffer, B that panel of K); at
  // kM = 128 all 64 columns for queries 64·warpgroup.. (A that dS panel, B K's only panel).
  __device__ __forceinline__ void issue_dq_gemm(float (&dq)[kDqRegs], int buf, int piece) const {
    if constexpr (kDqT) {
      issue_dq_transposed_gemm(dq, buf, piece);
    } else {
      using Mma = ptx::WgmmaSSTransposed<Element, 64>;
      const uint32_t a = ptx::smem_addr(ss.ds[buf]) + (kM == 128 ? warpgroup * kN * 128 : 0);
      const uint32_t b = ptx::smem_addr(ss.k) + (kM == 64 ? (kPieces * warpgroup + piece) * kN * 128 : 0);
      const uint64_t ad = ptx::make_smem_desc(a, kN * 128, 1024, 128);
      const uint64_t bd = ptx::make_smem_desc(b, kN * 128, 1024, 128);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk)  // 16 keys = 16 rows of 128 bytes in both
        Mma::mma(dq, advance(ad, kk * 16 * 128), advance(bd, kk * 16 * 128), kk > 0);
    }
  }

  // Hands the dQ piece to this warpgroup's writer warp (backward_dq_writer.cuh) through the
  // piece buffer, in dq_accum.cuh's order (transposed: dq_transposed_layout.hpp's), once the
  // writer has read the previous one.
  // With Cfg::kDqFromRegisters the piece is added to the accumulator in global memory from the
  // registers instead (red.global.add.v4.f32, the same order of floats), nothing waited for.
  __device__ __forceinline__ void hand_over_dq_piece(const float (&dq)[kDqRegs], int ordinal) const {
    using namespace ptx;
    const int t = threadIdx.x % 128;
    if constexpr (Cfg::kDqFromRegisters) {
      float* dst = dq_piece_destination<Cfg>(p, work, ordinal / kPieces, ordinal % kPieces, warpgroup);
#pragma unroll
      for (int j = 0; j < kDqRegs / 4; ++j) {
        red_add_v4_f32(dst + dq_float_index(t, j), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
      }
    } else {
      if (ordinal > 0) named_barrier_sync(BackwardBarrier::kDqEmpty0 + warpgroup, BackwardBarrier::kDqThreads);
#pragma unroll
      for (int j = 0; j < kDqRegs / 4; ++j)
        reinterpret_cast<float4*>(ss.dq_piece[warpgroup])[dq_float_index(t, j) / 4] =
            make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
      // (the writer's bulk reduce reads the buffer through the async proxy)
      fence_proxy_async_shared();
      named_barrier_arrive(BackwardBarrier::kDqFull0 + warpgroup, BackwardBarrier::kDqThreads);
    }
  }

  // Where thread t's dq[4j .. 4j + 3] go in a piece (dq_transposed_layout.hpp).
  __device__ __forceinline__ static int dq_float_index(int t, int j) {
    return Cfg::DqPiece::float_index(t, 4 * j);
  }

  // The step's dQ pieces after the first (d = 512: two a consumer), each into the same registers
  // once the previous one is handed over, while the dK GEMM still runs.
  __device__ __forceinline__ void hand_over_other_dq_pieces(float (&dq)[kDqRegs], int buf, int step) const {
    using namespace ptx;
#pragma unroll
    for (int piece = 1; piece < kPieces; ++piece) {
      issue_dq_gemm(dq, buf, piece);
      wgmma_commit();
      wgmma_wait<0>();
      pin(dq);
      hand_over_dq_piece(dq, step * kPieces + piece);
    }
  }

  // Where this consumer's kKV columns start in a kM-row tile of Q or dO (panels of kM x 128
  // bytes): column_half.cuh's consumer_column0 in panels (0 without a split head dim).
  __device__ __forceinline__ uint32_t kv_column_bytes() const {
    return consumer_column0<Cfg>(warpgroup) / 64 * kM * 128;
  }

  // Frees a ring slot: every consumer thread arrives (the empty barriers count
  // kSlotReleases), so each thread's reads of the slot's per-row terms (ordinary loads, beside
  // the GEMMs' reads that the wgmma waits cover) are ordered before the producer's next load
  // into it. One arrival per warpgroup (run 102) or per warp after a __syncwarp (run 104) left
  // the other threads' reads unordered for racecheck.
  __device__ __forceinline__ static void release(uint64_t* empty) { ptx::mbarrier_arrive(ptx::smem_addr(empty)); }

  // WARPATTN_TUNE_BWD_EARLY_DV: dV += Pᵀ·dO one k16 step (16 queries) at a time, each step
  // issued as soon as its Pᵀ registers are packed, and that step's dSᵀ = Pᵀ ∘ (dPᵀ − D) computed
  // and packed while the tensor cores run it, so the dS phase no longer leaves them idle. Step by
  // step because a whole packed Pᵀ beside the whole Sᵀ and dPᵀ (and dK, dV) does not fit in
  // the consumers' 240 registers (the one-shot order spilled and serialised the wgmmas at
  // 80 rows); this way each step's Sᵀ registers die as its Pᵀ and dSᵀ are packed. One wgmma
  // group (committed here), waited for with dQ's. b: dO's columns of this consumer. (The softcap
  // branch inside the loop makes ptxas add a warpgroup.arrive there, C7519; deciding it once
  // outside, with two copies of the loop, serialised the wgmmas for want of registers.)
  __device__ __forceinline__ void early_dv_and_score_gradients(float (&dv)[kKV / 2], const float (&s)[kM / 2],
                                                               float (&dp)[kM / 2], uint32_t (&pt)[kM / 16][4],
                                                               uint32_t (&dst)[kM / 16][4], uint32_t b, int stage,
                                                               int q_stage, const float2 (&d_first)[kEarlyGroups]) const {
    static_assert(kEarlyGroups == 2, "one k16 step's 8-query groups");
    const uint64_t bd = register_gemm_b_desc<kM * 128>(b);
    float2 d_next[kEarlyGroups];  // (Cfg::kEarlyRowTerms) the next k16 step's D pairs, a step ahead
    if constexpr (Cfg::kEarlyRowTerms) {
#pragma unroll
      for (int g = 0; g < kEarlyGroups; ++g) d_next[g] = d_first[g];
    }
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) {
      float2 d_now[kEarlyGroups];
      if constexpr (Cfg::kEarlyRowTerms) {
#pragma unroll
        for (int g = 0; g < kEarlyGroups; ++g) d_now[g] = d_next[g];
        if (kk + 1 < kM / 16) load_row_pairs(d_next, ss.row_d[stage], 2 * kk + 2);
      }
      accumulator_step_to_operand<Element>(s, kk, pt[kk]);
      ptx::wgmma_fence();  // pt[kk] was just written
      issue_register_gemm_step<Element, kKV>(dv, pt[kk], bd, kk);
      score_gradients(s, dp, stage, q_stage, d_now, 2 * kk, 2 * kk + 2);
      accumulator_step_to_operand<Element>(dp, kk, dst[kk]);
    }
    ptx::wgmma_fence();  // dSᵀ's registers, written beside dV's wgmmas, before dK's reads them
    ptx::wgmma_commit();
  }

  __device__ __forceinline__ void run() const {
    using namespace ptx;
    float dk[kKV / 2], dv[kKV / 2];
#pragma unroll
    for (int i = 0; i < kKV / 2; ++i) dk[i] = dv[i] = 0.f;
    const uint32_t k_rows = smem_addr(ss.k) + (key0 - work.n_block * kN) * 128;
    const uint32_t v_rows = smem_addr(ss.v) + (key0 - work.n_block * kN) * 128;
    const int steps = work.steps();
    if (steps > 0) mbarrier_wait(smem_addr(&ss.kv_full), 0);
    for (int step = 0; step < steps; ++step) {
      const RingSlot qs = ring_slot<Cfg::kQStages>(step), ds = ring_slot<Cfg::kDoStages>(step);
      // The step's first query, for a band's mask (without one only keys past seqlen_k are masked)
      const int q0 = Cfg::kCausal ? work.m_block<Cfg>(step) * kM : 0;
      const int buf = step % 2;
      float s[kM / 2], dp[kM / 2];
      if (Cfg::kStaggeredStart && step == 0 && warpgroup == 1)
        named_barrier_sync(BackwardBarrier::kStaggeredStart, 256);
      mbarrier_wait(smem_addr(&ss.q_full[qs.stage]), qs.phase);
      issue_rows_gemm<Element, Cfg::kPanels, kN, kM, 128>(s, k_rows, smem_addr(ss.q[qs.stage]));
      wgmma_commit();
      mbarrier_wait(smem_addr(&ss.do_full[ds.stage]), ds.phase);
      issue_rows_gemm<Element, Cfg::kPanels, kN, kM, 128>(dp, v_rows, smem_addr(ss.dout[ds.stage]));
      wgmma_commit();
      // (Cfg::kEarlyRowTerms: the first groups' LSE and D loaded while their GEMMs run)
      float2 lse_first[kEarlyLseGroups], d_first[kEarlyGroups];
      if constexpr (Cfg::kEarlyRowTerms) load_row_pairs(lse_first, ss.lse_log2[qs.stage]);
      wgmma_wait<1>();
      pin(s);
      probabilities(s, qs.stage, q0, lse_first);
      if (Cfg::kStaggeredStart && step == 0 && warpgroup == 0)
        named_barrier_arrive(BackwardBarrier::kStaggeredStart, 256);
      if constexpr (Cfg::kEarlyRowTerms) load_row_pairs(d_first, ss.row_d[ds.stage]);
      wgmma_wait<0>();
      pin(dp);
      // A consumer's dK and dV columns: its kKV with the head dim split, else all.
      const uint32_t kv_columns = kv_column_bytes();
      uint32_t pt[kM / 16][4], dst[kM / 16][4];
      if constexpr (Cfg::kEarlyDv) {
        early_dv_and_score_gradients(dv, s, dp, pt, dst, smem_addr(ss.dout[ds.stage]) + kv_columns, ds.stage,
                                     qs.stage, d_first);
      } else {
        score_gradients(s, dp, ds.stage, qs.stage, d_first);
        accumulator_to_operand<Element, kM>(s, pt);
        accumulator_to_operand<Element, kM>(dp, dst);
      }
      // dSᵀ to shared memory before the register GEMMs read dst (registers an in-flight wgmma
      // reads must not be touched until it completes). With the head dim split, both consumers
      // hold the same dS: consumer 0 stores it. Lagged: into a buffer whose last dQ GEMMs (step
      // - 2's, the other consumer's in its step - 1) have completed.
      if (Cfg::kLaggedDq && step >= 2)
        named_barrier_sync(lagged_barrier(BackwardBarrier::kDsBufferRead, 1 - warpgroup, buf), 256);
      if (!Cfg::kSplitHeadDim || warpgroup == 0) {
        write_ds(dst, buf);
        fence_proxy_async_shared();
      }
      if (Cfg::kLaggedDq) named_barrier_arrive(lagged_barrier(BackwardBarrier::kDsHalfWritten, warpgroup, buf), 256);
      if constexpr (!Cfg::kEarlyDv) {  // (early: dV's operands are in flight, untouched until its wait)
        pin(dv);
        pin(pt);
      }
      pin(dk);
      pin(dst);
      // dV (unless issued early), then dQ once both halves of dS are written, then dK: dQ
      // completes first among what the writer waits for, and dK runs while the dQ piece is
      // handed over.
      if constexpr (!Cfg::kEarlyDv) {
        wgmma_fence();
        issue_register_gemm<Element, kKV, kM / 16, kM * 128>(dv, pt, smem_addr(ss.dout[ds.stage]) + kv_columns);
        wgmma_commit();
      }
      // The step's dQ, or lagged the previous step's (lagged, the first step has none: its own
      // branch, since registers a path leaves unwritten would be live around the whole loop).
      const int dq_step = Cfg::kLaggedDq ? step - 1 : step;
      const uint32_t q_columns = smem_addr(ss.q[qs.stage]) + kv_columns;
      if (!Cfg::kLaggedDq || dq_step >= 0) {
        float dq[kDqRegs];
        wait_for_ds(dq_step);
        issue_dq_gemm(dq, dq_step % 2, 0);
        wgmma_commit();
        issue_register_gemm<Element, kKV, kM / 16, kM * 128>(dk, dst, q_columns);
        wgmma_commit();
        wgmma_wait<1>();  // dV and dQ
        pin(dv);
        pin(dq);
        pin(pt);
        release(&ss.do_empty[ds.stage]);
        // (lagged: the buffer's next writer, step dq_step + 2, waits for this)
        if (Cfg::kLaggedDq && dq_step + 2 < steps)
          named_barrier_arrive(lagged_barrier(BackwardBarrier::kDsBufferRead, warpgroup, dq_step % 2), 256);
        hand_over_dq_piece(dq, dq_step * kPieces);
        hand_over_other_dq_pieces(dq, dq_step % 2, dq_step);
      } else {
        wgmma_fence();  // (after pin(dk): in the other branch the dQ GEMM's fence comes first)
        issue_register_gemm<Element, kKV, kM / 16, kM * 128>(dk, dst, q_columns);
        wgmma_commit();
        wgmma_wait<1>();  // dV
        pin(dv);
        pin(pt);
        release(&ss.do_empty[ds.stage]);
      }
      wgmma_wait<0>();  // dK
      pin(dk);
      pin(dst);
      release(&ss.q_empty[qs.stage]);
    }
    if (Cfg::kLaggedDq && steps > 0) {  // the last step's dQ
      float dq[kDqRegs];
      wait_for_ds(steps - 1);
      issue_dq_gemm(dq, (steps - 1) % 2, 0);
      wgmma_commit();
      wgmma_wait<0>();
      pin(dq);
      hand_over_dq_piece(dq, (steps - 1) * kPieces);
    }
    // A cut tile's part: its partial sums handed to the part that finishes last, or, the last,
    // the others' added to its own.
    static_assert(kKV / 2 == Cfg::kAccumulatorFloats, "the tail split's slots hold kAccumulatorFloats a thread");
    if constexpr (Cfg::kTailSplit)
      if (work.part >= 0 && !add_up_cut_tile(dk, dv, p, work, warpgroup, &ss.tail_ticket)) return;
    store(dk, dv);
  }

  // Lagged dQ's named barriers: `first` + 2 x consumer + dS buffer (backward_shared_storage.cuh).
  __device__ __forceinline__ static int lagged_barrier(int first, int consumer, int buf) {
    return first + 2 * consumer + buf;
  }

  // Before the dQ GEMM of `step`: both consumers' halves of its dS are in shared memory. Each
  // step both meet here; lagged, only the other's half is waited for (this one's own was
  // written a step ago, and this sync orders its writes too: the barrier counts this consumer's
  // 128 threads).
  __device__ __forceinline__ void wait_for_ds(int step) const {
    if constexpr (Cfg::kLaggedDq) {
      static_assert(kPieces == 1 && !Cfg::kSplitHeadDim, "lagged dQ: one piece a consumer, dS of both consumers");
      ptx::named_barrier_sync(lagged_barrier(BackwardBarrier::kDsHalfWritten, 1 - warpgroup, step % 2), 256);
    } else {
      ptx::named_barrier_sync(BackwardBarrier::kDsWritten, 256);
    }
  }

  // dK (times the softmax scale: dK = scale · dSᵀ·Q) and dV for the keys before seqlen_k: this
  // warpgroup's kKV columns.
  __device__ __forceinline__ void store(float (&dk)[kKV / 2], const float (&dv)[kKV / 2]) const {
#pragma unroll
    for (int i = 0; i < kKV / 2; ++i) dk[i] *= p.softmax_scale;
    const int column0 = consumer_column0<Cfg>(warpgroup);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key0 + f.row(r);
      const bool inside = key < work.seqlen_k;
      const int row = work.k_offset + key;
      store_accumulator_row<Element, kKV>(
          dk, r, f.quad, inside ? p.dk.row<Element>(work.batch, row, work.head_kv) + column0 : nullptr,
          p.head_dim - column0);
      store_accumulator_row<Element, kKV>(
          dv, r, f.quad, inside ? p.dv.row<Element>(work.batch, row, work.head_kv) + column0 : nullptr,
          p.head_dim_v - column0);
    }
  }
};

}  // namespace warpattn::detail
