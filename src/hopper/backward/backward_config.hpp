// Compile-time shape of one backward kernel instantiation.
//
// A CTA owns one key block of kBlockN = 128 keys of one (batch, KV head): K and V stay in
// shared memory, dK and dV in registers, while it walks the query blocks of every query head
// of the KV head's group (GQA folded into the tile: dK and dV need no reduction across CTAs).
// Two consumer warpgroups own 64 keys each; S and dP are computed transposed (keys on the
// wgmma M axis: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ), so their accumulators, Pᵀ and dSᵀ, are already the A
// operands of dV += Pᵀ·dO and dK += dSᵀ·Q. dQ = dS·K reads dS from shared memory. That is
// d = 64 and 128; d = 256 has a tile of its own (kBlockN80), d = 512 splits the head dim.
#pragma once
#include <cstdint>
#include <type_traits>

#include "hopper/backward/backward_block_m.hpp"
#include "hopper/backward/dq_transposed_layout.hpp"

// dV += Pᵀ·dO issued one k16 step at a time as Pᵀ is packed, so that the dS phase (dSᵀ =
// Pᵀ ∘ (dPᵀ − D) and its packing) runs under that GEMM instead of beside an idle tensor pipe
// (docs/backward-design.md, "dV before dS"). 0: dV after dS; 1 (the default): early at d = 128,
// +2-6% on the H200 (run 176); 2: at d = 64 too, where it measured -2 to +1%.
#ifndef WARPATTN_TUNE_BWD_EARLY_DV
#define WARPATTN_TUNE_BWD_EARLY_DV 1
#endif

// dQ one step late (docs/backward-design.md, "Lagged dQ"): a consumer issues step j's dQ GEMM
// in step j + 1, where the other consumer's half of dS(j) is long written, instead of meeting it
// at a barrier every step, so the two consumers no longer run in lockstep and one's exponentials
// and dS can run under the other's GEMMs. 0: off; 1: lagged (d = 64 and 128); 2 (the default):
// lagged, and consumer 1 starts its first step after consumer 0's first softmax (half a step
// behind). Run 208 (H100, 3 interleaved passes): value 2 +2.9 to +3.8% at d = 128, -0.6 to
// +3.4% at d = 64; value 1 +3.5% at 16K but nothing at 4K.
#ifndef WARPATTN_TUNE_BWD_LAGGED_DQ
#define WARPATTN_TUNE_BWD_LAGGED_DQ 2
#endif

// dQ added to global memory by the consumers themselves, red.global.add.v4.f32 straight from the
// dQ GEMM's registers (docs/backward-design.md, "dQ from registers"), instead of staged in
// shared memory for a writer warp's bulk reduce: no staging stores, proxy fence or hand-over
// barrier in the consumer's step. Never in the deterministic mode (its turns order whole bulk
// adds). 0: off; 1 (the default): at d = 256, whose consumers hand over four 32-column pieces a
// step through an 8 KB buffer, +8-12% there (run 211, H100, 3 interleaved passes); 2: at every
// head dim (d = 64 and 128: -1 to -5%, run 211, where the freed staging spent on a third Q and
// dO stage did no better; d = 512 untimed).
#ifndef WARPATTN_TUNE_BWD_DQ_RED
#define WARPATTN_TUNE_BWD_DQ_RED 1
#endif

// The row terms (LSE and D, per query, in shared memory) loaded further ahead of their use
// (docs/backward-design.md, "The row terms' latency"): run 216's profile of d = 128 had ~10% of
// the consumers' stall samples on the short scoreboard at the first use of each pair of them,
// each LDS.64 issued a few instructions before its FFMA / FADD. 1: the first two query groups'
// LSE loaded before the S GEMM is waited for, their D before the dP GEMM is, and with the early
// dV each k16 step's D loaded one step ahead (4 more registers), at d = 64 and 128. Run 218
// (H100, 3 interleaved passes): +0.6 to +4.3% at d = 128, -0.3 to +3.1% at d = 64; run 219
// (H200, the same): d = 128 +2.0 / +2.6 / +2.1% at 4K causal, 16K full and causal (4K full too
// noisy to call), d = 64 +0.0 to +1.5%. 2: and every group's LSE before the S wait, as
// FlashAttention-3 reads them (20 registers at 80 rows): run 219, below 1 at every d = 128 point
// (-0.7 to -3.6%) and at d = 64 but for 4K causal. 0: loaded where used. The default: 1.
#ifndef WARPATTN_TUNE_BWD_EARLY_ROW_TERMS
#define WARPATTN_TUNE_BWD_EARLY_ROW_TERMS 1
#endif

// The banded (causal, window) kernels' launch order without the deterministic mode, at d = 256
// (key_block_work.hpp's grouped_longest_first): the (batch, KV head) rows in groups whose Q, dO
// and dQ accumulator fit this many MB, longest key block first within a group. 0: the grid's
// order (key blocks fastest, each row's longest first). A model of list scheduling on 132 SMs
// put the grid's order 6-7% over the ideal at 4K tokens (d = 128, 256; 3% at d = 64) and the
// groups within ~1%; FlashAttention-3 takes its causal backward in such groups (40 MB). Run 221
// (H100, 3 interleaved passes, causal, beside cuDNN): 40 MB at d = 256 +1.4 / +2.6 / +4.5% at
// 2K / 4K / 8K tokens, but at d = 128 -1.3 / -0.6 / +0.4% and at d = 64 -3.5 / -3.3 / +0.2% (20 MB:
// d = 128 -1.8 / +1.5 / +1.7%, d = 64 -1.7 / -1.0 / +0.6%): less than the model, whose tail the
// hardware partly hides, and at the smaller head dims, whose steps read more bytes a FLOP, the
// L2 held less of each group than of the grid's few rows. So d = 256 only (kLongestFirst).
#ifndef WARPATTN_TUNE_BWD_LONGEST_FIRST_MB
#define WARPATTN_TUNE_BWD_LONGEST_FIRST_MB 40
#endif
// 1: the order at every head dim (an A/B's variant: d = 64 and 128 lost on the H100 in run 221,
// d = 128 by 9% at N = 1024 causal in run 243; untimed on the H200 and at d = 512).
#ifndef WARPATTN_TUNE_BWD_LONGEST_FIRST_ALL_DIMS
#define WARPATTN_TUNE_BWD_LONGEST_FIRST_ALL_DIMS 0
#endif

// The tail split (tail_split.hpp, tail_fixup.cuh) in the kernels without a band at d = 64, 128
// and 256, outside the deterministic mode: the last tiles' query steps cut over more CTAs, so
// that the last wave does not leave SMs idle (2048 tiles on 132 SMs: 15.52 waves). 0: never.
#ifndef WARPATTN_TUNE_BWD_TAIL_SPLIT
#define WARPATTN_TUNE_BWD_TAIL_SPLIT 1
#endif

// The walk's order outside the deterministic mode, whose turns need the ascending walk
// (docs/backward-design.md, "The walk's order"; key_block_work.hpp). Neither changes a step, only
// which query block a step takes. All 0 (off) until measured.
// ROTATE 1: key block n's walk starts n query blocks into its range (wrapping), in every kernel,
// so the key blocks running together add dQ into different blocks, not all into one. Without a
// mask they all walk in step today (87 CTAs on one block at 16K tokens in
// scripts/walk_order_l2_model.py); under a causal mask the launch's later rows fall into step too
// (16.5); rotated, ~1. Run 296's deterministic mode, whose turns stagger those adds, beat the
// default at 16K (d = 64 525.0 against 488.7 TFLOP/s, causal 496.5 against 470.3). 2: n x (query
// blocks) / (key blocks) on, spread over the walk (walk_rotation). Takes the warp-wide producer
// (WARP_PRODUCER, below) with it. Expected +1-5% at 16K, 0-3% at 4K without a mask.
#ifndef WARPATTN_TUNE_BWD_ROTATE
#define WARPATTN_TUNE_BWD_ROTATE 0
#endif
// WALK_DOWN 1: the banded kernels (causal, window) walk each range last to first (rotated or
// not). Built for the L2 (a causal row's blocks read and added over the row's whole life), which
// the model above then found holds a 16K row either way (only first-touch misses down to a 20 MB
// L2); descending puts more CTAs on one block (26.7 at 16K), so it is the rotation's control:
// level if those adds cost nothing, slower if they do.
#ifndef WARPATTN_TUNE_BWD_WALK_DOWN
#define WARPATTN_TUNE_BWD_WALK_DOWN 0
#endif

// The producer as the whole of warp 0 (backward_producer.cuh) rather than one thread: its
// warp-uniform walk can then live in uniform registers, not the thread's 24 (the rotated walk
// spilled a one-thread producer at d = 128). 1, or ROTATE on: at every head dim. 0 (the
// default): one thread, as measured until now.
#ifndef WARPATTN_TUNE_BWD_WARP_PRODUCER
#define WARPATTN_TUNE_BWD_WARP_PRODUCER 0
#endif

namespace warpattn::detail {

template <class Element_, int kHeadDim_, bool kCausal_, bool kDeterministic_>
struct BackwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kDeterministic = kDeterministic_;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kSlotReleases = 128 * kConsumerWarpgroups;  // every consumer thread arrives
  // Above d = 128 a consumer's dK and dV for all the columns would not fit in its registers: the
  // consumers split the head dim (kSplitHeadDim), each keeping dK and dV for kKVColumns of them.
  // d = 256: the 80-key tile below, each consumer 128 columns of dKᵀ and dVᵀ for all 80 keys.
  // d = 512 (docs/headdim512-design.md, "The backward at 512"): a consumer's half would be 256
  // columns, dK + dV 256 registers. Two CTAs take each key block instead (kColumnHalves), CTA h
  // owning columns 256h .. 256h + 255 of dK, dV and dQ, 128 of them a consumer (128 registers).
  // Both consumers take the same 64 keys and each computes S and dP whole, over all 512 columns
  // (the same values, bit for bit; consumer 0 stores dS), so those two GEMMs are done four times.
  // Its query block is 32 rows (kBlockM) so that K, V, Q and dO, all 512 columns wide, fit in
  // shared memory.
  static constexpr bool kSplitHeadDim = kHeadDim >= 256;
  static constexpr bool kEarlyDv = (kHeadDim == 128 && WARPATTN_TUNE_BWD_EARLY_DV >= 1) ||
                                   (kHeadDim == 64 && WARPATTN_TUNE_BWD_EARLY_DV >= 2);
  static constexpr bool kLaggedDq = !kSplitHeadDim && WARPATTN_TUNE_BWD_LAGGED_DQ >= 1;
  static constexpr bool kStaggeredStart = kLaggedDq && WARPATTN_TUNE_BWD_LAGGED_DQ >= 2;
  static constexpr bool kEarlyRowTerms = !kSplitHeadDim && WARPATTN_TUNE_BWD_EARLY_ROW_TERMS >= 1;
  static constexpr bool kEarlyLse = kEarlyRowTerms && WARPATTN_TUNE_BWD_EARLY_ROW_TERMS >= 2;
  static constexpr bool kLongestFirst =
      kCausal && !kDeterministic && (kHeadDim == 256 || WARPATTN_TUNE_BWD_LONGEST_FIRST_ALL_DIMS) &&
      WARPATTN_TUNE_BWD_LONGEST_FIRST_MB > 0;
  static constexpr bool kDqFromRegisters =
      !kDeterministic && ((kHeadDim == 256 && WARPATTN_TUNE_BWD_DQ_RED >= 1) || WARPATTN_TUNE_BWD_DQ_RED >= 2);
  static constexpr int kColumnHalves = kHeadDim == 512 ? 2 : 1;  // CTAs per key block
  static constexpr int kCtaColumns = kHeadDim / kColumnHalves;   // a CTA's dK, dV and dQ columns
  // d = 256: 80 keys a CTA (FlashAttention-3's d = 256 tile; docs/backward-design.md, "Key blocks
  // of 80 at d = 256"): BackwardConsumerN80, its own consumer (S and dP untransposed, each
  // consumer 40 keys; dK and dV transposed, each consumer 128 columns of them for all 80 keys).
  // Run 173 timed it +9-11% over the 64-key d = 256 tile it replaced.
  static constexpr bool kBlockN80 = kHeadDim == 256;
  static constexpr bool kWalkDown = kCausal && !kDeterministic && WARPATTN_TUNE_BWD_WALK_DOWN >= 1;
  static constexpr bool kWarpProducer = WARPATTN_TUNE_BWD_WARP_PRODUCER >= 1 || WARPATTN_TUNE_BWD_ROTATE >= 1;
  // walk_rotation's mode, with the warp-wide producer: a one-thread producer's loop, at its 24
  // registers, spilled with the rotation at d = 128 (whatever the form: a division a step or a
  // cursor), and ptxas then serialized the consumers' wgmmas (C7512).
  static constexpr int kRotate = kDeterministic ? 0 : WARPATTN_TUNE_BWD_ROTATE;
  static constexpr bool kRotated = kRotate > 0;
  static constexpr bool kTailSplit = !kCausal && !kDeterministic && kColumnHalves == 1 && WARPATTN_TUNE_BWD_TAIL_SPLIT >= 1;
  static constexpr int kBlockN = kBlockN80 ? 80 : kSplitHeadDim ? 64 : 64 * kConsumerWarpgroups;  // keys per CTA
  static constexpr int kKVColumns = kSplitHeadDim ? kCtaColumns / 2 : kHeadDim;  // dK, dV columns per consumer
  // A consumer thread's dK (and dV) floats: its keys (64; all 80 at d = 256) x kKVColumns over 128.
  static constexpr int kAccumulatorFloats = (kBlockN80 ? kBlockN : 64) * kKVColumns / 128;
  // Query rows per step. dQ's tile (kBlockM x d) is split over the two consumers in pieces of
  // 64 x 64: at d = 128 one each (the same 64 queries, columns 64·consumer..), at d = 256 four
  // pieces of 64 x 32 each (columns 128·consumer..: kDqPieceColumns), at d = 64 the whole
  // row width, so each takes 64 of kBlockM = 128 queries. d = 128 with
  // WARPATTN_TUNE_BWD_BLOCK_M(_CAUSAL) = 80 (backward_block_m.hpp): 80 rows, not a multiple of
  // the wgmma's M = 64, so dQ is computed transposed (kDqTransposed, FlashAttention-3's
  // dQ_swapAB): dQᵀ = Kᵀ·dSᵀ, head dim on M (consumer c: columns 64c..), the 80 queries on N,
  // dS stored [query][key] for it; a piece is then 64 columns x 80 rows.
  // d = 512: 32 rows, so dQ is transposed as at 80 (its M, the head dim, in 64-column pieces:
  // two per consumer, the consumer's 128 columns).
  static constexpr int kBlockM = kHeadDim == 64    ? 128
                                 : kHeadDim == 128 ? (kCausal ? kBackwardD128CausalBlockM : kBackwardD128BlockM)
                                 : kHeadDim == 512 ? 32
                                                   : 64;
  static constexpr bool kDqTransposed = kBlockM % 64 != 0;
  // The accumulator's pieces as the consumers write them and the conversion reads them
  // (dq_transposed_layout.hpp), and the query blocks the conversion takes: kBlockM rows
  // transposed, else 64.
  using DqPiece = std::conditional_t<kDqTransposed, DqTransposedPiece<kBlockM>, DqUntransposedPiece>;
  static constexpr int kDqConversionRows = kDqTransposed ? kBlockM : 64;
  // A dQ piece's columns (untransposed: 64 query rows). 32 with kBlockN80, whose shared memory
  // has 8 KB a consumer for it, not 16 (the 80-key K and V tiles): a 32-column piece is the
  // first or second half of a 64 x 64 piece of the accumulator's layout (dq_accum.cuh: an m64n64
  // accumulator's d[0 .. 15] or d[16 .. 31]), so the workspace, the conversion kernel and the
  // turns' pieces are as before, each added in two bulk reduces.
  static constexpr int kDqPieceColumns = kBlockN80 ? 32 : 64;
  static constexpr int kDqPiecesPerConsumer = kSplitHeadDim ? kKVColumns / kDqPieceColumns : 1;
  static_assert(kDqTransposed ? kHeadDim == 64 * kConsumerWarpgroups * kDqPiecesPerConsumer * kColumnHalves
                              : kBlockM / 64 * kHeadDim / kDqPieceColumns == kConsumerWarpgroups * kDqPiecesPerConsumer,
                "the consumers' dQ pieces (of every CTA of a key block) tile the step's dQ");
  // The workspace's row granule (a multiple of kBlockM: query blocks never span two sequences).
  static constexpr int kRowGranule = backward_row_granule(kHeadDim);
  static_assert(kRowGranule % kBlockM == 0 && kRowGranule % 64 == 0, "whole blocks in the padded rows");
  // Q (+ LSE) and dO (+ D) buffers; d = 256 keeps one dO buffer to fit in shared memory (dO is
  // free again after the dV GEMM, early in a step); d = 512 one Q buffer too (K and V alone are
  // 128 KB there: K 64 + V 64 + Q 32 + dO 32 + dS 8 + dQ pieces 16 = 216 KB of 227).
  static constexpr int kQStages = kHeadDim == 512 ? 1 : 2;
  static constexpr int kDoStages = kSplitHeadDim ? 1 : 2;
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte panels per row
  static constexpr int kQTileBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKTileBytes = kBlockN * kHeadDim * 2;
  // dS as [key][query], 64-query panels; transposed dQ: as [query][key], 64-key panels.
  static constexpr int kDsTileBytes = kBlockN * kBlockM * 2;
  // P, stored as Pᵀ in dSᵀ's layout (kBlockN80: 80 key rows of 64 queries)
  static constexpr int kPtTileBytes = kBlockN80 ? kDsTileBytes : 0;
  static constexpr int kDqPieceFloats = 64 * (kDqTransposed ? kBlockM : kDqPieceColumns);  // a wgmma accumulator's
  // The bulk reduces a key block makes into one query block of dQ (the deterministic turns count them)
  static constexpr int kDqAddsPerKeyBlock = kHeadDim / (kDqTransposed ? 64 : kDqPieceColumns);
  // setmaxnreg: 24 + 2 x 240 = 504 per 128 threads, within the launch's 384 x 168.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(128 * (kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters) <= kThreads * kLaunchRegisters,
                "setmaxnreg.inc would wait forever");
};

}  // namespace warpattn::detail
