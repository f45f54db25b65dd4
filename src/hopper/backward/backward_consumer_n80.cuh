// A consumer warpgroup of the d = 256 backward, 80 keys a CTA (BackwardConfig::kBlockN80;
// FlashAttention-3's d = 256 tile; docs/backward-design.md, "Key blocks of 80 at d = 256").
// Consumer c, per step of 64 queries:
//   S  = Q·Kᵀ, dP = dO·Vᵀ          SS m64n40: queries on M, c's 40 keys (40c ..) on N, not
//                                  transposed and not repeated (the other consumer has the
//                                  other 40 keys); LSE and D per row: 2 values a thread
//   P  = exp2(S·scale·log2e − LSE)  masked where the step needs it (the same test as
//   dS = P ∘ (dP − D)               BackwardConsumer's, with rows and columns swapped)
//   P, dS → [key][query] tiles       stmatrix.trans (block_n80_layout.hpp), both consumers' keys
//   dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS      SS m64n80, head dim on M: c's 128 columns in two 64-column
//                                  slices (A = the dO / Q panel read MN-major), all 80 keys on N
//                                  (B = the P / dS tile, K-major); 2 x 2 x 40 = 160 registers
//   dQ = dS·K                       SS m64n64 (A = dS read MN-major, B = a K panel read
//                                  MN-major), two GEMMs over c's 128 columns, each handed to the
//                                  writer warp as two 32-column pieces (8 KB of shared memory
//                                  each)
//   dK, dV out                      transposed back by movmatrix, 4-byte pairs per key row
// It reuses BackwardConsumer's dQ hand-over, slot release, and the producer, writer, rings and
// turn counters unchanged.
#pragma once

#include "hopper/backward/backward_consumer.cuh"
#include "hopper/backward/block_n80_layout.hpp"

namespace warpattn::detail {

template <class Cfg>
struct BackwardConsumerN80 : BackwardConsumer<Cfg> {
  using Base = BackwardConsumer<Cfg>;
  using Element = typename Cfg::Element;
  using L = BlockN80Layout;
  static constexpr int kM = Cfg::kBlockM, kN = Cfg::kBlockN, kKeys = L::kConsumerKeys;
  static constexpr int kSlices = Cfg::kKVColumns / 64;  // 64-column slices of dKᵀ, dVᵀ (M = 64 each)
  static constexpr int kAcc = kN / 2;                   // an m64n80 accumulator's registers
  static constexpr int kPieces = Cfg::kDqPiecesPerConsumer, kDqRegs = Base::kDqRegs;
  // A dQ GEMM's columns: two pieces of kDqPieceColumns. One GEMM a piece, 32 columns with B 64
  // bytes into K's swizzled rows for every second one, was timed slower on the H200 (run 173).
  static constexpr int kDqGemmColumns = 64;
  static_assert(Cfg::kBlockN80 && kM == 64 && kN == L::kKeys && kKeys * Cfg::kConsumerWarpgroups == kN &&
                    Cfg::kDqPieceColumns == 32 && kDqRegs == 16 && Cfg::kDoStages == 1 && kPieces == 4 &&
                    kDqGemmColumns == 2 * Cfg::kDqPieceColumns,
                "the 80-key tile of docs/backward-design.md");
  using Base::f;
  using Base::p;
  using Base::ss;
  using Base::warpgroup;
  using Base::work;

  __device__ __forceinline__ BackwardConsumerN80(BackwardSharedStorage<Cfg>& ss_, const BackwardParams& p_,
                                                 const KeyBlockWork& work_, int warpgroup_)
      : Base(ss_, p_, work_, warpgroup_) {}

  // This consumer's first key (its 40 of the CTA's 80).
  __device__ __forceinline__ int key0() const { return work.n_block * kN + kKeys * warpgroup; }

  // P from S in place (BackwardConsumer::probabilities with queries on rows): LSE per row; keys
  // past seqlen_k (zero-filled by TMA) and outside a query's band masked. Element (j, r, e) pairs
  // query q0 + f.row(r) with key key0 + f.col(j, e), so i - k = base + 8r - 8j - e with base =
  // q0 + f.row(0) - key0 - f.col(0, 0): the same three thresholds a thread as there.
  __device__ __forceinline__ void probabilities(float (&s)[kKeys / 2], int stage, int q0) const {
    const float* lse = ss.lse_log2[stage];
    if (kBackwardHasSoftcap<Cfg::kHeadDim> && p.softcap_ex2 != 0.f) softcap_scores<false>(s, p.softcap_ex2);
    const float c = p.probability_log2;
    const float l[2] = {lse[f.row(0)], lse[f.row(1)]};
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) s[4 * j + 2 * r + e] = ptx::exp2_approx(fmaf(s[4 * j + 2 * r + e], c, -l[r]));
    const KeyBand band = Cfg::kCausal ? p.band : KeyBand{};
    if (!kv_tile_needs_mask(work.n_block, kN, q0, kM, work.seqlen_q, work.seqlen_k, band)) return;
    const int offset = work.seqlen_k - work.seqlen_q;
    const int base = q0 + f.row(0) - key0() - f.col(0, 0);
    const int lo = band.right == kUnbounded ? -(kM + kN) : -(offset + band.right) - base;  // hidden below
    const int hi = band.left == kUnbounded ? kM + kN : band.left - offset - base;          // hidden above
    const int key_end = work.seqlen_k - key0() - f.col(0, 0);  // keys past seqlen_k: 8j + e >= key_end
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int x = 8 * r - 8 * j - e;
          if (8 * j + e >= key_end || (Cfg::kCausal && (x < lo || x > hi))) s[4 * j + 2 * r + e] = 0.f;
        }
  }

  // dS = P ∘ (dP − D) in dp's registers, D per row (BackwardConsumer::score_gradients' softcap
  // factor likewise, with LSE per row).
  __device__ __forceinline__ void score_gradients(const float (&s)[kKeys / 2], float (&dp)[kKeys / 2], int stage,
                                                  int q_stage) const {
    const float* row_d = ss.row_d[stage];
    const float* lse = ss.lse_log2[q_stage];
    const bool capped = kBackwardHasSoftcap<Cfg::kHeadDim> && p.softcap_ex2 != 0.f;
    const float d[2] = {row_d[f.row(0)], row_d[f.row(1)]};
    if (capped) {
      score_gradients_loop<true>(s, dp, d, lse);
    } else {
      score_gradients_loop<false>(s, dp, d, lse);
    }
  }
  template <bool kCapped>
  __device__ __forceinline__ void score_gradients_loop(const float (&s)[kKeys / 2], float (&dp)[kKeys / 2],
                                                       const float (&d)[2], const float* lse) const {
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      const int r = i % 4 / 2;
      const float prob = s[i];
      float g = prob * (dp[i] - d[r]);
      if constexpr (kCapped) {
        const float t = (ptx::log2_approx(prob) + lse[f.row(r)]) * p.softcap_inv_log2;
        g *= prob > 0.f ? fmaf(-t, t, 1.f) : 0.f;
      }
      dp[i] = g;
    }
  }

  // x (an m64n40 accumulator) packed to 16 bits into this consumer's 40 key rows of the
  // [key][query] tile at `tile` (block_n80_layout.hpp): three stmatrix.trans a warp.
  __device__ __forceinline__ void write_tile(const float (&x)[kKeys / 2], uint8_t* tile) const {
    const int lane = threadIdx.x % 32;
    const uint32_t t = ptx::smem_addr(tile);
    const auto reg = [&](int call, int mat) {
      const int i = L::first_register(call, mat);
      return ptx::pack_pair<Element>(x[i], x[i + 1]);
    };
#pragma unroll
    for (int call = 0; call < 2; ++call)
      ptx::stmatrix_x4_trans(t + L::row_offset(warpgroup, f.warp, lane, call), reg(call, 0), reg(call, 1),
                             reg(call, 2), reg(call, 3));
    ptx::stmatrix_x2_trans(t + L::row_offset(warpgroup, f.warp, lane % 16, 2), reg(2, 0), reg(2, 1));
  }

  // acc[s] += Aᵀ·B for the consumer's two 64-column slices: A = panel 2c + s of the step's Q or
  // dO tile (64 query rows of 128 bytes) read MN-major (tnspA: the head dim on M; +16 rows per
  // k16), B = the [key][query] tile (P or dS) read K-major (80 key rows; +32 bytes per k16).
  __device__ __forceinline__ void issue_transposed_kv_gemm(float (&acc)[kSlices][kAcc], uint32_t tile,
                                                           uint32_t rows) const {
    using Mma = ptx::WgmmaSSTransposedA<Element, kN>;
    const uint64_t bd = kmajor_desc<128>(rows);
#pragma unroll
    for (int s = 0; s < kSlices; ++s) {
      const uint64_t ad = ptx::make_smem_desc(tile + (kSlices * warpgroup + s) * kM * 128, kM * 128, 1024, 128);
#pragma unroll
      for (int kk = 0; kk < kM / 16; ++kk) Mma::mma(acc[s], advance(ad, kk * 16 * 128), advance(bd, kk * 32), 1);
    }
  }

  // dQ columns column0 .. column0 + 63 (a panel of c's 128 from 128c) = dS·K: A = dS, the
  // [key][query] tile read MN-major (the queries on M; +16 key rows per k16), B = K's panel
  // column0 / 64 read MN-major; 5 k16 steps over the 80 keys.
  __device__ __forceinline__ void issue_dq_gemm(float (&dq)[kDqGemmColumns / 2], int buf, int column0) const {
    using Mma = ptx::WgmmaSSTransposed<Element, kDqGemmColumns>;
    const uint32_t b = ptx::smem_addr(ss.k) + column0 / 64 * kN * 128;
    const uint64_t ad = ptx::make_smem_desc(ptx::smem_addr(ss.ds[buf]), kN * 128, 1024, 128);
    const uint64_t bd = ptx::make_smem_desc(b, kN * 128, 1024, 128);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      Mma::mma(dq, advance(ad, kk * 16 * 128), advance(bd, kk * 16 * 128), kk > 0);
  }
  // The first column of this consumer's 32-column piece `piece`.
  __device__ __forceinline__ int piece_column0(int piece) const {
    return Cfg::kKVColumns * warpgroup + Cfg::kDqPieceColumns * piece;
  }

  // One step. Buffers: P in the dO slot's tile (its only reader, the dV GEMM, is dO's last; a
  // consumer writes it after waiting for the slot's next load, which follows both consumers'
  // do_empty arrivals after their dV waits), dS in ds[buf] (its readers at step s - 2 were waited
  // for before either consumer reached step s - 1's kDsWritten barrier).
  __device__ __forceinline__ void step(float (&dk)[kSlices][kAcc], float (&dv)[kSlices][kAcc], uint32_t k_rows,
                                       uint32_t v_rows, RingSlot qs, RingSlot ds, int m_block, int buf,
                                       int step) const {
    using namespace ptx;
    float s[kKeys / 2], dp[kKeys / 2];
    // A: the 64-row Q / dO tile; B: this consumer's 40 rows of the 80-row K / V tile (5 x 1024 B in)
    mbarrier_wait(smem_addr(&ss.q_full[qs.stage]), qs.phase);
    issue_rows_gemm<Element, Cfg::kPanels, kM, kKeys, 128, kN>(s, smem_addr(ss.q[qs.stage]), k_rows);
    wgmma_commit();
    mbarrier_wait(smem_addr(&ss.do_full[ds.stage]), ds.phase);
    issue_rows_gemm<Element, Cfg::kPanels, kM, kKeys, 128, kN>(dp, smem_addr(ss.dout[ds.stage]), v_rows);
    wgmma_commit();
    wgmma_wait<1>();
    pin(s);
    probabilities(s, qs.stage, m_block * kM);
    wgmma_wait<0>();
    pin(dp);
    score_gradients(s, dp, ds.stage, qs.stage);
    write_tile(s, ss.pt[ds.stage]);
    write_tile(dp, ss.ds[buf]);
    fence_proxy_async_shared();                            // the stores, before wgmma reads them
    named_barrier_sync(BackwardBarrier::kDsWritten, 256);  // both consumers' keys written
    // dV, dQ's first GEMM, dK; dV and the dQ GEMM are waited for first, dK while its pieces are
    // handed over and the next GEMM computed.
#pragma unroll
    for (int i = 0; i < kSlices; ++i) pin(dv[i]), pin(dk[i]);
    wgmma_fence();
    issue_transposed_kv_gemm(dv, smem_addr(ss.dout[ds.stage]), smem_addr(ss.pt[ds.stage]));
    wgmma_commit();
    float dq[kDqGemmColumns / 2];
    issue_dq_gemm(dq, buf, piece_column0(0));
    wgmma_commit();
    issue_transposed_kv_gemm(dk, smem_addr(ss.q[qs.stage]), smem_addr(ss.ds[buf]));
    wgmma_commit();
    wgmma_wait<1>();  // dV and the first dQ GEMM
#pragma unroll
    for (int i = 0; i < kSlices; ++i) pin(dv[i]);
    pin(dq);
    Base::release(&ss.do_empty[ds.stage]);
    // A GEMM gives two pieces, d[0 .. 15] and d[16 .. 31], handed over in turn.
    const auto half = [&](int h) -> const float(&)[kDqRegs] {
      return *reinterpret_cast<const float(*)[kDqRegs]>(dq + kDqRegs * h);
    };
#pragma unroll
    for (int gemm = 0; gemm < kPieces / 2; ++gemm) {
      if (gemm > 0) {
        issue_dq_gemm(dq, buf, piece_column0(2 * gemm));
        wgmma_commit();
        wgmma_wait<0>();  // the GEMM (and, the first time, dK: Q's last reader)
        pin(dq);
        if (gemm == 1) {
#pragma unroll
          for (int i = 0; i < kSlices; ++i) pin(dk[i]);
          Base::release(&ss.q_empty[qs.stage]);
        }
      }
      this->hand_over_dq_piece(half(0), step * kPieces + 2 * gemm);
      this->hand_over_dq_piece(half(1), step * kPieces + 2 * gemm + 1);
    }
  }

  __device__ __forceinline__ void run() const {
    using namespace ptx;
    float dk[kSlices][kAcc], dv[kSlices][kAcc];
#pragma unroll
    for (int s = 0; s < kSlices; ++s)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) dk[s][i] = dv[s][i] = 0.f;
    const uint32_t k_rows = smem_addr(ss.k) + kKeys * warpgroup * 128;
    const uint32_t v_rows = smem_addr(ss.v) + kKeys * warpgroup * 128;
    if (work.steps() > 0) mbarrier_wait(smem_addr(&ss.kv_full), 0);
    for (int i = 0; i < work.steps(); ++i) {
      const RingSlot qs = ring_slot<Cfg::kQStages>(i), ds = ring_slot<Cfg::kDoStages>(i);
      step(dk, dv, k_rows, v_rows, qs, ds, work.template m_block<Cfg>(i), i % 2, i);
    }
    // A cut tile's part (tail_fixup.cuh): its sums handed on, or, the last, the others' added.
    static_assert(kSlices * kAcc == Cfg::kAccumulatorFloats, "the tail split's slots hold kAccumulatorFloats a thread");
    if constexpr (Cfg::kTailSplit)
      if (work.part >= 0 && !add_up_cut_tile(dk, dv, p, work, warpgroup, &ss.tail_ticket)) return;
    store(dk, dv);
  }

  // dK (times the softmax scale) and dV for the keys before seqlen_k, this consumer's 128
  // columns (those before the tensors' head dims): each 8x8 block of a slice's accumulator
  // (columns on M, keys on N) transposed by movmatrix, so a thread holds one key row's 4-byte
  // pair (block_n80_layout.hpp's transposed_pair).
  __device__ __forceinline__ void store(float (&dk)[kSlices][kAcc], const float (&dv)[kSlices][kAcc]) const {
#pragma unroll
    for (int s = 0; s < kSlices; ++s)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) dk[s][i] *= p.softmax_scale;
    const int t = threadIdx.x % 128;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const int key = work.n_block * kN + L::transposed_pair(t, j, 0).key;
      const bool inside = key < work.seqlen_k;
      const int row = work.k_offset + key;
      Element* dk_row = p.dk.template row<Element>(work.batch, row, work.head_kv);
      Element* dv_row = p.dv.template row<Element>(work.batch, row, work.head_kv);
#pragma unroll
      for (int s = 0; s < kSlices; ++s)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int col = Cfg::kKVColumns * warpgroup + 64 * s + L::transposed_pair(t, j, r).column;
          const uint32_t k2 = ptx::movmatrix_trans(ptx::pack_pair<Element>(dk[s][4 * j + 2 * r], dk[s][4 * j + 2 * r + 1]));
          const uint32_t v2 = ptx::movmatrix_trans(ptx::pack_pair<Element>(dv[s][4 * j + 2 * r], dv[s][4 * j + 2 * r + 1]));
          // a head dim between compiled ones is a multiple of 8: a pair is wholly in or out
          if (inside && col < p.head_dim) *reinterpret_cast<uint32_t*>(dk_row + col) = k2;
          if (inside && col < p.head_dim_v) *reinterpret_cast<uint32_t*>(dv_row + col) = v2;
        }
    }
  }
};

}  // namespace warpattn::detail
