// Compile-time shape of one backward kernel instantiation.
//
// A CTA owns one key block of kBlockN = 128 keys of one (batch, KV head): K and V stay in
// shared memory, dK and dV in registers, while it walks the query blocks of every query head
// of the KV head's group (GQA folded into the tile: dK and dV need no reduction across CTAs).
// Two consumer warpgroups own 64 keys each; S and dP are computed transposed (keys on the
// wgmma M axis: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ), so their accumulators, Pᵀ and dSᵀ, are already the A
// operands of dV += Pᵀ·dO and dK += dSᵀ·Q. dQ = dS·K reads dS from shared memory.
#pragma once
#include <cstdint>

#include "hopper/backward/backward_block_m.hpp"
// d = 256 (docs/backward-design.md): each consumer computes S and dP only for its own 32 of the
// step's 64 queries and both store Pᵀ and dSᵀ to shared memory, so that dV and dK read their A
// operands from there: 1, the default (+2.8% without a mask, +4.4% causal on the H200, run 163).
// 0: each consumer computes S and dP for all 64 (two GEMMs done twice), P and dS in registers.
#ifndef WARPATTN_TUNE_BWD_D256_SPLIT_QUERIES
#define WARPATTN_TUNE_BWD_D256_SPLIT_QUERIES 1
#endif
// d = 256 (docs/backward-design.md, "Key blocks of 80 at d = 256"), not yet run on the H200:
//   0  the default: 64 keys a CTA as above (WARPATTN_TUNE_BWD_D256_SPLIT_QUERIES)
//   1  FlashAttention-3's d = 256 tile, 80 keys x 64 queries a CTA (backward_consumer_n80.cuh):
//      S = Q·Kᵀ and dP = dO·Vᵀ not transposed (each consumer 40 of the 80 keys), P and dS through
//      shared memory, dK and dV transposed (head dim on the wgmma M axis: each consumer dKᵀ and
//      dVᵀ for its 128 columns and all 80 keys, 160 registers), dQ in 32-column pieces
//   2  the same with each dQ GEMM 64 columns wide, handed over as two 32-column pieces: the
//      fallback should 1's 32-column GEMM, whose B starts 64 bytes into K's swizzled rows, not
//      read as modelled
#ifndef WARPATTN_TUNE_BWD_D256_BLOCK_N80
#define WARPATTN_TUNE_BWD_D256_BLOCK_N80 2
#endif

// dV += Pᵀ·dO issued as soon as Pᵀ is packed, before dSᵀ is computed, so that the dS phase
// (dSᵀ = Pᵀ ∘ (dPᵀ − D), its packing and its store) runs under that GEMM instead of beside an
// idle tensor pipe (docs/backward-design.md, "dV before dS"). Costs Pᵀ's packed registers live
// through the dS phase. 0: dV after dS (as measured so far); 1: early at d = 128; 2: at d = 64
// and 128. Not yet run on the H200.
#ifndef WARPATTN_TUNE_BWD_EARLY_DV
#define WARPATTN_TUNE_BWD_EARLY_DV 1
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
  // d = 256: a consumer's dK and dV for 64 keys would take 256 registers a thread. There both
  // consumers take the same 64 keys and split the head dim: each keeps dK and dV for half of its
  // columns, and each computes S and dP whole (the same values, bit for bit; consumer 0 stores
  // dS). That repeats two of the five GEMMs, the price of keeping P and dS in registers.
  // d = 512 (docs/headdim512-design.md, "The backward at 512"): a consumer's half would be 256
  // columns, dK + dV 256 registers. Two CTAs take each key block instead (kColumnHalves), CTA h
  // owning columns 256h .. 256h + 255 of dK, dV and dQ, split over its consumers as at d = 256
  // (128 columns each: 128 registers); each computes S and dP whole (over all 512 columns), so
  // those two GEMMs are done four times. Its query block is 32 rows (kBlockM) so that K, V, Q and
  // dO, all 512 columns wide, fit in shared memory.
  static constexpr bool kSplitHeadDim = kHeadDim >= 256;
  static constexpr bool kEarlyDv = (kHeadDim == 128 && WARPATTN_TUNE_BWD_EARLY_DV >= 1) ||
                                   (kHeadDim == 64 && WARPATTN_TUNE_BWD_EARLY_DV >= 2);
  static constexpr int kColumnHalves = kHeadDim == 512 ? 2 : 1;  // CTAs per key block
  static constexpr int kCtaColumns = kHeadDim / kColumnHalves;   // a CTA's dK, dV and dQ columns
  // d = 256 with WARPATTN_TUNE_BWD_D256_BLOCK_N80: 80 keys a CTA (BackwardConsumerN80, its own
  // consumer: S and dP untransposed, each consumer 40 keys; dK and dV transposed, each consumer 128
  // columns of them for all 80 keys).
  static constexpr bool kBlockN80 = kHeadDim == 256 && WARPATTN_TUNE_BWD_D256_BLOCK_N80 != 0;
  static constexpr int kBlockN = kBlockN80 ? 80 : kSplitHeadDim ? 64 : 64 * kConsumerWarpgroups;  // keys per CTA
  static constexpr int kKVColumns = kSplitHeadDim ? kCtaColumns / 2 : kHeadDim;  // dK, dV columns per consumer
  // Query rows per step. dQ's tile (kBlockM x d) is split over the two consumers in pieces of
  // 64 x 64: at d = 128 one each (the same 64 queries, columns 64·consumer..), at d = 256 two
  // each (columns 128·consumer..), at d = 64 the whole row width, so each takes 64 of kBlockM =
  // 128 queries. d = 128 with WARPATTN_TUNE_BWD_BLOCK_M(_CAUSAL) = 80 (backward_block_m.hpp):
  // 80 rows, not a multiple of the wgmma's M = 64, so dQ is computed transposed (kDqTransposed,
  // FlashAttention-3's dQ_swapAB): dQᵀ = Kᵀ·dSᵀ, head dim on M (consumer c: columns 64c..),
  // the 80 queries on N, dS stored [query][key] for it; a piece is then 64 columns x 80 rows.
  // d = 512: 32 rows, so dQ is transposed as at 80 (its M, the head dim, in 64-column pieces:
  // two per consumer, the consumer's 128 columns).
  static constexpr int kBlockM = kHeadDim == 64    ? 128
                                 : kHeadDim == 128 ? (kCausal ? kBackwardD128CausalBlockM : kBackwardD128BlockM)
                                 : kHeadDim == 512 ? 32
                                                   : 64;
  static constexpr bool kDqTransposed = kBlockM % 64 != 0;
  // A dQ piece's columns (untransposed: 64 query rows). 32 with kBlockN80, whose shared memory
  // has 8 KB a consumer for it, not 16 (the 80-key K and V tiles): a 32-column piece is the
  // first or second half of a 64 x 64 piece of the accumulator's layout (dq_accum.cuh: an m64n32
  // accumulator's registers are an m64n64's d[0 .. 15] or d[16 .. 31]), so the workspace, the
  // conversion kernel and the turns' pieces are as before, each added in two bulk reduces.
  static constexpr int kDqPieceColumns = kBlockN80 ? 32 : 64;
  static constexpr int kDqGemmColumns = kBlockN80 && WARPATTN_TUNE_BWD_D256_BLOCK_N80 == 2 ? 64 : kDqPieceColumns;
  static_assert(WARPATTN_TUNE_BWD_D256_BLOCK_N80 >= 0 && WARPATTN_TUNE_BWD_D256_BLOCK_N80 <= 2,
                "WARPATTN_TUNE_BWD_D256_BLOCK_N80: 0, 1 or 2");
  static constexpr int kDqPiecesPerConsumer = kSplitHeadDim ? kKVColumns / kDqPieceColumns : 1;
  // With the head dim split, WARPATTN_TUNE_BWD_D256_SPLIT_QUERIES: consumer c computes Sᵀ and
  // dPᵀ for queries kSdpQueries·c .. of the step only (no GEMM done twice), stores its Pᵀ and
  // dSᵀ columns to shared memory, and dV, dK become SS GEMMs over all kBlockM queries.
  static constexpr bool kSplitQueries = kHeadDim == 256 && WARPATTN_TUNE_BWD_D256_SPLIT_QUERIES != 0 && !kBlockN80;
  static constexpr int kSdpQueries = kSplitQueries ? kBlockM / kConsumerWarpgroups : kBlockM;
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
  // Pᵀ, dSᵀ's layout (d = 256; with kBlockN80: P stored as Pᵀ, 80 key rows of 64 queries)
  static constexpr int kPtTileBytes = kSplitQueries || kBlockN80 ? kDsTileBytes : 0;
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
