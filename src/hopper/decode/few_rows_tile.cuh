// A KV-cache work tile with few real rows (a decode step: 4 rows at 32 / 8 query heads and one
// position), run with the keys in wgmma's M and the rows in its N, so that the padding sits on
// the small side of both GEMMs (docs/decode-design.md, "The few-row tile"; its probe,
// tools/probes/p_decode_few_rows.cu):
//   Sᵀ (64 keys x kFewRows) = K·Qᵀ    A = 64 rows of the K tile, B = the Q tile's first kFewRows
//                                      rows, both K-major as TMA put them (issue_rows_gemm);
//   Oᵀ (d x kFewRows) += Vᵀ·Pᵀ         A = V read MN-major (one m64 per 64-column panel), B = Pᵀ
//                                      [row][key] in shared memory (stmatrix.trans), K-major.
// Both consumer warpgroups work at once, warpgroup w on keys 64 w .. 64 w + 63 of every key
// tile, each with its own (max, sum, Oᵀ); no ping-pong turns. A column's (a row's) max over the
// warpgroup's 64 keys goes through shared memory; the sums stay per thread until the end. At the
// end of the tile both states meet in the Q buffer and warpgroup 0 takes the merged O back into
// the wide fragment layout (rows on M), so the epilogue, the split pieces' partial states and
// the combine stay the wide tile's.
//
// Shared memory: none of its own. The scratch (each warpgroup's Pᵀ, kFewRows rows of 128 bytes
// = 64 keys, and its max exchange) and the merge live in
//   1: the Q buffer, whose rows kFewRows .. the Sᵀ GEMM never reads: the scratch in panel 0's
//      rows kFewRows .., the merge anywhere once both walks are done. The tile then holds its Q
//      buffer to its end (the wide tile frees it after its last S GEMM), and the next tile's Q
//      and with it the ring's next steps wait for the merge;
//   2: the K tile of the key tile's own ring slot, in the 64 rows of panel 0 that the
//      warpgroup's Sᵀ GEMM has just read (no other warpgroup reads them), the merge in the last
//      key tile's K slot. Each K slot is then freed after its Oᵀ GEMM, not after its Sᵀ one (the
//      last after the merge), and the Q buffer after the last Sᵀ GEMM, as the wide tile does.
#pragma once

#include "hopper/barriers.hpp"
#include "hopper/consumer.cuh"
#include "hopper/consumer_gemms.cuh"
#include "hopper/fragment.cuh"
#include "hopper/kv_tiles.hpp"
#include "hopper/ptx/math.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/softcap.cuh"
#include "hopper/softmax.cuh"
#include "hopper/transposed_rows.cuh"

// 1 or 2: a 16-bit KV cache's tiles with at most kFewRows real rows take this form, its scratch
// where the value says (below; an A/B; 0: none).
#ifndef WARPATTN_TUNE_KV_FEW_ROWS
#define WARPATTN_TUNE_KV_FEW_ROWS 0
#endif

namespace warpattn::detail {

inline constexpr int kFewRows = 32;  // the most rows the form takes (wgmma N of both GEMMs)
// WARPATTN_TUNE_KV_FEW_ROWS_N16=1: tiles of at most 16 rows take N = 16 (half the tensor work and
// the softmax's values; a decode step with 4 query heads a KV head has 4 rows).
#ifndef WARPATTN_TUNE_KV_FEW_ROWS_N16
#define WARPATTN_TUNE_KV_FEW_ROWS_N16 0
#endif

// WARPATTN_TUNE_KV_FEW_ROWS_E4M3=1: an E4M3 cache's tiles too (d = 128: its K and Q rows one
// 128-byte panel), Sᵀ and Oᵀ as FP8 GEMMs, Pᵀ in bytes (tools/probes/p_decode_few_rows.cu -DPROBE_E4M3=1).
#ifndef WARPATTN_TUNE_KV_FEW_ROWS_E4M3
#define WARPATTN_TUNE_KV_FEW_ROWS_E4M3 0
#endif

template <class Cfg>
inline constexpr bool kFewRowsTiles = WARPATTN_TUNE_KV_FEW_ROWS != 0 && Cfg::kKvCache &&
                                      (!Cfg::kFp8 || (WARPATTN_TUNE_KV_FEW_ROWS_E4M3 && Cfg::kVtSlices)) &&
                                      !Cfg::kIntScores && !Cfg::kSplitHeadDim && Cfg::kBlockN == 128 &&
                                      Cfg::kConsumerWarpgroups == 2 && Cfg::kSwizzleBytes == 128;

// The real rows of a KV-cache tile: its packed heads at the positions below seqlen_q.
__device__ __forceinline__ int kvcache_tile_rows(int first_position, const ForwardParams& params, int seqlen_q) {
  const int positions = min(params.packing.positions, seqlen_q - first_position);
  return positions > 0 ? positions * params.packing.heads : 0;
}

template <class Cfg, int kRows = kFewRows>
struct FewRowsTile {
  using Element = typename Cfg::Element;
  static constexpr int kMBlocks = Cfg::kHeadDim / 64;  // Oᵀ's m64 blocks: V's 64-column panels
  static_assert(kRows == 16 || kRows == 32, "wgmma N: the generated shapes");
  static constexpr int kCols = kRows / 8;            // a thread's column pairs (j) of an m64nN accumulator
  static constexpr uint32_t kPanelRowBytes = 128;
  static constexpr bool kScratchInKeys = WARPATTN_TUNE_KV_FEW_ROWS == 2;
  // A warpgroup's scratch (bytes from its base, 1024-aligned: Pᵀ's swizzle atoms): Pᵀ, then its
  // max exchange [4 warps][kRows] floats. Its base: in the Q buffer past the rows read, Pᵀ of
  // warpgroup w at kRows + kRows w rows, the exchanges after both; in a K tile, the
  // warpgroup's first row. The merge (from the buffer's start): Oᵀ as floats [d][kMergeStride],
  // the sums [2][4][kRows], the maxima [2][kRows].
  // Pᵀ: kRows rows of the warpgroup's 64 keys (16-bit: one 128-byte swizzled row each; E4M3: four
  // 16-key slices of kRows rows x 16 B, transposed_rows.cuh).
  static constexpr uint32_t kPtBytes = 64 * kRows * sizeof(Element), kExchangeBytes = 4 * kRows * 4;
  static constexpr uint32_t kPtSliceBytes = kRows * 16, kVtSliceBytes = Cfg::kHeadDim * 16;  // (E4M3)
  static constexpr uint32_t kQScratchOffset = kRows * kPanelRowBytes;
  static constexpr int kMergeStride = kRows + 1;  // (floats; +1: fewer bank conflicts)
  static constexpr int kMergeBufferBytes = kScratchInKeys ? Cfg::kKTileBytes : Cfg::kQTileBytes;
  // The merge passes Oᵀ through the buffer kMergeBlocks m64 blocks at a time: all at once where
  // they fit (16-bit), one at a time in an E4M3 cache's 16 KB K tile.
  static constexpr int kMergeBlocks =
      kMBlocks * 64 * kMergeStride * 4 + 2 * 4 * kRows * 4 + 2 * kRows * 4 + 16 <= kMergeBufferBytes ? kMBlocks : 1;
  static constexpr uint32_t kMergeSumsOffset = (kMergeBlocks * 64 * kMergeStride * 4 + 15) / 16 * 16;
  static constexpr uint32_t kMergeMaxOffset = kMergeSumsOffset + 2 * 4 * kRows * 4;
  static_assert(kQScratchOffset + 2 * (kPtBytes + kExchangeBytes) <= Cfg::kBlockM * kPanelRowBytes,
                "the scratch fits in the Q buffer's first panel past the Q rows read");
  static_assert(kPtBytes + kExchangeBytes <= 64 * kPanelRowBytes, "a warpgroup's scratch fits in its K rows");
  static_assert(kMergeMaxOffset + 2 * kRows * 4 <= kMergeBufferBytes, "the merge fits in its buffer");

  SharedStorage<Cfg>& ss;
  const ForwardParams& params;
  const TileContext& t;
  const FragmentCoords f;
  const int wg;  // consumer warpgroup: keys 64 wg .. of every key tile
  uint8_t* const q_buffer;
  const uint32_t q_addr;
  const int first_position;
  const MaskedTiles masked;
  const ConsumerTile<Cfg> wide;  // the wide tile's score_scale and v_terms (E4M3: its descales)

  __device__ __forceinline__ FewRowsTile(SharedStorage<Cfg>& ss_, const ForwardParams& p, const TileContext& t_)
      : ss(ss_),
        params(p),
        t(t_),
        f(threadIdx.x % 128),
        wg(t_.warpgroup),
        q_buffer(ss_.q[t_.q_stage]),
        q_addr(ptx::smem_addr(ss_.q[t_.q_stage])),
        first_position(first_row_of_block<Cfg>(t_.m_block, p)),
        masked(masked_tiles(first_position, rows_of_block<Cfg>(p), Cfg::kBlockN, t_.seqlen_q, t_.seqlen_k, band())),
        wide(ss_, p, t_) {}

  __device__ __forceinline__ KeyBand band() const { return Cfg::kCausal ? params.band : KeyBand{}; }
  __device__ __forceinline__ int key_tile(int it) const { return t.n_end - 1 - it; }
  __device__ __forceinline__ void sync_warpgroup() const { ptx::named_barrier_sync(Barrier::kFewRows0 + wg, 128); }

  // This warpgroup's Pᵀ and max exchange for the key tile of ring slot `slot`.
  __device__ __forceinline__ uint8_t* scratch(RingSlot slot) const {
    return kScratchInKeys ? ss.k[slot.stage] + wg * 64 * kPanelRowBytes : q_buffer + kQScratchOffset + wg * kPtBytes;
  }
  __device__ __forceinline__ uint32_t pt_addr(RingSlot slot) const { return ptx::smem_addr(scratch(slot)); }
  __device__ __forceinline__ float* exchange(RingSlot slot) const {
    return reinterpret_cast<float*>(kScratchInKeys ? scratch(slot) + kPtBytes
                                                   : q_buffer + kQScratchOffset + 2 * kPtBytes + wg * kExchangeBytes);
  }

  // Sᵀ of ordinal it into st (issued and committed, not waited for).
  __device__ __forceinline__ void issue_scores(float (&st)[kRows / 2], RingSlot ks) const {
    ptx::mbarrier_wait(ptx::smem_addr(&ss.k_full[ks.stage]), ks.phase);
    issue_rows_gemm<typename Cfg::QKElement, Cfg::kPanels, Cfg::kBlockN, kRows, 128, Cfg::kBlockM>(
        st, ptx::smem_addr(ss.k[ks.stage]) + wg * 64 * kPanelRowBytes, q_addr);
    ptx::wgmma_commit();
  }
  // Oᵀ += Vᵀ·Pᵀ of slot vs (issued and committed).
  // E4M3: A = the warpgroup's four 16-key slices of the Vᵀ tile (K-major, no swizzle: LBO one
  // slice, between a k32 step's two core matrices along K; SBO 128 B, between 8-row groups; m64
  // block mb 1024 B on), B = Pᵀ in the same slices; each k32 step two slices on.
  __device__ __forceinline__ void issue_output(float (&ot)[kMBlocks][kRows / 2], RingSlot vs) const {
    ptx::mbarrier_wait(ptx::smem_addr(&ss.v_full[vs.stage]), vs.phase);
    const uint32_t v_tile = ptx::smem_addr(ss.v[vs.stage]);
    const uint64_t bd = Cfg::kFp8 ? ptx::make_plain_smem_desc(pt_addr(vs), kPtSliceBytes, 128) : kmajor_desc<128>(pt_addr(vs));
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) ptx::pin(ot[mb]);
    ptx::wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
      if constexpr (Cfg::kFp8) {
        const uint64_t ad = ptx::make_plain_smem_desc(v_tile + 4 * wg * kVtSliceBytes + mb * 64 * 16, kVtSliceBytes, 128);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
          ptx::WgmmaSS<Element, kRows>::mma(ot[mb], advance(ad, kk * 2 * kVtSliceBytes),
                                            advance(bd, kk * 2 * kPtSliceBytes), 1);
      } else {
        const uint64_t ad = ptx::make_smem_desc(v_tile + wg * 64 * kPanelRowBytes + mb * Cfg::kBlockN * kPanelRowBytes,
                                                Cfg::kBlockN * kPanelRowBytes, 1024, 128);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          ptx::WgmmaSSTransposedA<Element, kRows>::mma(ot[mb], advance(ad, kk * 16 * kPanelRowBytes),
                                                         advance(bd, kk * 32), 1);
      }
    }
    ptx::wgmma_commit();
  }

  // The scores of ordinal it once waited for: its K slot freed (2: the Q buffer after the
  // last), softcapped, masked where the tile needs it (key = register row, the tile's row =
  // register column).
  __device__ __forceinline__ void finish_scores(float (&st)[kRows / 2], int it, RingSlot ks) const {
    if constexpr (!kScratchInKeys) release_slot(&ss.k_empty[ks.stage]);
    else if (it == t.n_tiles - 1) release_slot(&ss.q_empty[t.q_stage]);
    if constexpr (!Cfg::kFp8)
      if (params.softcap_ex2 != 0.f) softcap_scores<true>(st, params.softcap_ex2);
    const int n = key_tile(it);
    if (!masked.needs(n)) return;
    const int key0 = n * Cfg::kBlockN + 64 * wg;
#pragma unroll
    for (int j = 0; j < kCols; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int position = first_position + packed_row(f.col(j, c), params.packing.heads).position;
        const int end = (Cfg::kCausal ? band_key_end(position, t.seqlen_q, t.seqlen_k, band()) : t.seqlen_k) - key0;
        const int begin = Cfg::kCausal ? band_key_begin(position, t.seqlen_q, t.seqlen_k, band()) - key0 : 0;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = f.row(r);
          if (key >= end || key < begin) st[4 * j + 2 * r + c] = -INFINITY;
        }
      }
  }

  // The first half of a key tile's softmax: each column's max over the warp's 16 keys, into the
  // exchange (the caller then waits for its previous Oᵀ GEMM before softmax_finish's barrier).
  __device__ __forceinline__ void softmax_local(const float (&st)[kRows / 2], RingSlot slot) const {
    float* const x_out = exchange(slot);
#pragma unroll
    for (int j = 0; j < kCols; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float x = column_max(fmaxf(st[4 * j + c], st[4 * j + 2 + c]));
        if (f.group == 0) x_out[f.warp * kRows + f.col(j, c)] = x;
      }
  }
  // The second half, past the warpgroup's barrier: the four warps' max, the new references m
  // (log2 units; -inf while a column has seen no key), Oᵀ's rescale alpha, P into pr, the
  // thread's sums l. Then Pᵀ into shared memory (store_transposed_rows), fenced for
  // the async proxy, and the barrier after which the warpgroup's Oᵀ GEMM may read it: every
  // warp has passed its wait for the previous Oᵀ GEMM before the first barrier, so no warp
  // overwrites a Pᵀ that GEMM still reads.
  // E4M3 (softmax.cuh's conventions, without the stale reference): the scores' scale is the key
  // tile's (Q's and K's descales), m includes log2 of the tile's V descale v, P = 2^(S c + log2 v
  // - m + kPLog2Offset) carries v (O needs no rescale for it) and is lifted into e4m3's range, and
  // l sums P / v.
  __device__ __forceinline__ void softmax_finish(const float (&st)[kRows / 2], float (&ot)[kMBlocks][kRows / 2],
                                                 float (&m)[kCols][2], float (&l)[kCols][2], RingSlot slot,
                                                 int it) const {
    const float* const x_in = exchange(slot);
    const float unit = wide.score_scale(it);  // raw scores to log2 units
    const auto v = wide.v_terms(it);          // ({0, 1} for a 16-bit cache)
    sync_warpgroup();
    float pr[kRows / 2];
#pragma unroll
    for (int j = 0; j < kCols; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = f.col(j, c);
        float x = x_in[col];
#pragma unroll
        for (int w = 1; w < 4; ++w) x = fmaxf(x, x_in[w * kRows + col]);
        const float m_new = fmaxf(m[j][c], Cfg::kFp8 ? fmaf(x, unit, v.log2) : x * unit);
        const float ref = m_new == -INFINITY ? 0.f : m_new;  // a column with no key yet: P = 0, not NaN
        const float alpha = ptx::exp2_approx(m[j][c] - ref);
        m[j][c] = m_new;
        const float addend = Cfg::kFp8 ? v.log2 + Cfg::kPLog2Offset - ref : -ref;
        pr[4 * j + c] = ptx::exp2_approx(fmaf(st[4 * j + c], unit, addend));
        pr[4 * j + 2 + c] = ptx::exp2_approx(fmaf(st[4 * j + 2 + c], unit, addend));
        const float sum = pr[4 * j + c] + pr[4 * j + 2 + c];
        l[j][c] = fmaf(l[j][c], alpha, Cfg::kFp8 ? sum * v.inv : sum);
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) ot[mb][4 * j + c] *= alpha, ot[mb][4 * j + 2 + c] *= alpha;
      }
    if constexpr (Cfg::kFp8) {
      store_transposed_rows_e4m3<kRows>(scratch(slot), f, pr);
    } else {
      uint32_t ops[kRows / 16][4];
      accumulator_to_operand<Element, kRows>(pr, ops);
      store_transposed_rows(pt_addr(slot), f.warp, ops);
    }
    ptx::fence_proxy_async_shared();
    sync_warpgroup();
  }

  // The walk over the tile's key tiles (the last first), Sᵀ of the next tile issued with Oᵀ of
  // this one and its scores' first half run under that GEMM.
  __device__ __forceinline__ void walk(float (&ot)[kMBlocks][kRows / 2], float (&m)[kCols][2],
                                       float (&l)[kCols][2]) const {
    using namespace ptx;
    float st[kRows / 2];
    const RingSlot k0 = ring_slot<Cfg::kStages>(t.kv_base);
    issue_scores(st, k0);
    wgmma_wait<0>();
    pin(st);
    finish_scores(st, 0, k0);
    softmax_local(st, k0);
    softmax_finish(st, ot, m, l, k0, 0);
    for (int it = 0; it + 1 < t.n_tiles; ++it) {
      const RingSlot vs = ring_slot<Cfg::kStages>(t.kv_base + it);
      const RingSlot ks = ring_slot<Cfg::kStages>(t.kv_base + it + 1);
      pin(st);
      issue_scores(st, ks);
      issue_output(ot, vs);
      wgmma_wait<1>();  // Sᵀ of it + 1 done; Oᵀ of it may still run
      pin(st);
      finish_scores(st, it + 1, ks);
      softmax_local(st, ks);
      wait_output(ot, vs, true);
      softmax_finish(st, ot, m, l, ks, it + 1);
    }
    const RingSlot last = ring_slot<Cfg::kStages>(t.kv_base + t.n_tiles - 1);
    issue_output(ot, last);
    wait_output(ot, last, false);
  }
  // After the Oᵀ GEMM of slot vs: its V slot is free, and (2) its K slot unless the merge is to
  // use it (the last).
  __device__ __forceinline__ void wait_output(float (&ot)[kMBlocks][kRows / 2], RingSlot vs, bool free_k) const {
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) ptx::pin(ot[mb]);
    release_slot(&ss.v_empty[vs.stage]);
    if (kScratchInKeys && free_k) release_slot(&ss.k_empty[vs.stage]);
  }

  // The merge: both warpgroups' states into (o, s) of warpgroup 0 in the wide tile's layout
  // (rows 0 .. kRows - 1 of its 64; the rest empty), warpgroup 1's left empty; Oᵀ passes through
  // the buffer kMergeBlocks m64 blocks at a time. Then the buffer is released: the Q buffer (1),
  // the last key tile's K slot (2).
  __device__ __forceinline__ void merge(const float (&ot)[kMBlocks][kRows / 2], const float (&m)[kCols][2],
                                        const float (&l)[kCols][2], float (&o)[Cfg::kOCols / 2],
                                        OnlineSoftmax& s) const {
    const RingSlot last = ring_slot<Cfg::kStages>(t.kv_base + t.n_tiles - 1);
    uint8_t* const buffer = kScratchInKeys ? ss.k[last.stage] : q_buffer;
    uint64_t* const buffer_empty = kScratchInKeys ? &ss.k_empty[last.stage] : &ss.q_empty[t.q_stage];
    float* merged = reinterpret_cast<float*>(buffer);  // [kMergeBlocks x 64 of d][kMergeStride]
    float* sums = reinterpret_cast<float*>(buffer + kMergeSumsOffset);  // [2][4][kRows]
    float* maxima = reinterpret_cast<float*>(buffer + kMergeMaxOffset);  // [2][kRows]
    // Each column's weights 2^(m_w - m) (warpgroup 0).
    auto weights = [&](int col, float& a0, float& a1, float& m_all) {
      const float m0 = maxima[col], m1 = maxima[kRows + col];
      m_all = fmaxf(m0, m1);
      a0 = m0 == -INFINITY ? 0.f : ptx::exp2_approx(m0 - m_all);
      a1 = m1 == -INFINITY ? 0.f : ptx::exp2_approx(m1 - m_all);
    };
#pragma unroll
    for (int b0 = 0; b0 < kMBlocks; b0 += kMergeBlocks) {
      // Both walks done (their Pᵀ, exchange and Q reads too) before the buffer is written; on a
      // later pass, warpgroup 0 done with the blocks before.
      ptx::named_barrier_sync(Barrier::kFewRowsMerge, 256);
      if (b0 == 0) {
#pragma unroll
        for (int j = 0; j < kCols; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float x = column_sum(l[j][c]);
            if (f.group == 0) sums[(wg * 4 + f.warp) * kRows + f.col(j, c)] = x;
            if (f.group == 0 && f.warp == 0) maxima[wg * kRows + f.col(j, c)] = m[j][c];
          }
      }
      if (wg == 1) {
#pragma unroll
        for (int mb = b0; mb < b0 + kMergeBlocks; ++mb)
#pragma unroll
          for (int j = 0; j < kCols; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int c = 0; c < 2; ++c)
                merged[(64 * (mb - b0) + f.row(r)) * kMergeStride + f.col(j, c)] = ot[mb][4 * j + 2 * r + c];
      }
      ptx::named_barrier_sync(Barrier::kFewRowsMerge, 256);
      if (wg == 1) continue;
      // Warpgroup 0: Oᵀ = Oᵀ_0 a_0 + Oᵀ_1 a_1 in place (each thread its own elements), then the
      // rows back in the wide layout.
#pragma unroll
      for (int j = 0; j < kCols; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float a0, a1, m_all;
          weights(f.col(j, c), a0, a1, m_all);
#pragma unroll
          for (int mb = b0; mb < b0 + kMergeBlocks; ++mb)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              float& x = merged[(64 * (mb - b0) + f.row(r)) * kMergeStride + f.col(j, c)];
              x = fmaf(ot[mb][4 * j + 2 * r + c], a0, x * a1);
            }
        }
      sync_warpgroup();
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = f.row(r);
        if (row < kRows) {
          if (b0 == 0) {
            float a0, a1, m_all;
            weights(row, a0, a1, m_all);
            float l0 = 0.f, l1 = 0.f;
#pragma unroll
            for (int w = 0; w < 4; ++w) l0 += sums[w * kRows + row], l1 += sums[(4 + w) * kRows + row];
            s.row_max[r] = m_all;
            s.row_sum[r] = f.quad == 0 ? fmaf(l0, a0, l1 * a1) : 0.f;  // (quad_sum adds the row's four lanes)
          }
#pragma unroll
          for (int j = 8 * b0; j < 8 * (b0 + kMergeBlocks); ++j)  // (the blocks' 64 columns each)
#pragma unroll
            for (int c = 0; c < 2; ++c) o[4 * j + 2 * r + c] = merged[(f.col(j, c) - 64 * b0) * kMergeStride + row];
        }
      }
    }
    // (a buffer TMA writes next: the generic writes ordered before the async proxy's)
    if (wg == 0) sync_warpgroup();  // every access to the buffer done
    ptx::fence_proxy_async_shared();
    release_slot(buffer_empty);
  }

  __device__ __forceinline__ void run(float (&o)[Cfg::kOCols / 2], OnlineSoftmax& s) const {
    float ot[kMBlocks][kRows / 2];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) ot[mb][i] = 0.f;
    float m[kCols][2], l[kCols][2];
#pragma unroll
    for (int j = 0; j < kCols; ++j) m[j][0] = m[j][1] = -INFINITY, l[j][0] = l[j][1] = 0.f;
    walk(ot, m, l);
    merge(ot, m, l, o, s);
  }
};

// A tile of `rows` (<= kFewRows) real rows in the few-row form, N the smallest that holds them.
template <class Cfg>
__device__ __forceinline__ void run_few_rows_tile(SharedStorage<Cfg>& ss, const ForwardParams& params,
                                                  const TileContext& t, int rows, float (&o)[Cfg::kOCols / 2],
                                                  OnlineSoftmax& s) {
  if (WARPATTN_TUNE_KV_FEW_ROWS_N16 && rows <= 16)
    FewRowsTile<Cfg, 16>(ss, params, t).run(o, s);
  else
    FewRowsTile<Cfg, kFewRows>(ss, params, t).run(o, s);
}

}  // namespace warpattn::detail
