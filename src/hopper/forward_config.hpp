// Compile-time shape of one forward kernel instantiation.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

// An E4M3 cache step's first key tiles loaded before its Q quantisation has finished
// (docs/decode-fp8-cache-design.md, "K and V before the wait"): the attention is launched as that
// kernel's programmatic dependent, and today every thread waits for it before anything is
// loaded, though only Q's codes and descales come from it. 1: only the producer's Q load and the
// consumers wait; the producer first fills the K and V rings of the CTA's first work tile (the
// default since run 215: 1.4-2.5 us off each E4M3 step, -2 to -5%). 0: all wait at the start.
#ifndef WARPATTN_TUNE_KVCACHE_FP8_EARLY_KV
#define WARPATTN_TUNE_KVCACHE_FP8_EARLY_KV 1
#endif

namespace warpattn::detail {

// Element_: the operand type of both GEMMs: __half, __nv_bfloat16, or __nv_fp8_e4m3 (FP8:
// Q, K and Vᵀ in e4m3 with descales, O written as OutElement_).
// QKElement_: the operands of the S GEMM; int8_t with FP8 for INT8 Q and K (int32 scores).
// kConsumerWarpgroups_: 2, or 3 where a consumer's registers fit in 160 (more warps to hide the
// softmax's latency where it, not the GEMMs, is the work: small head dims).
// kQStages_: Q buffers (1 or 2; 0 = 2 when shared memory allows). With two, the next work
// tile's Q loads during the whole current tile instead of after its last S GEMM.
// kHeadDimV_: V's (and O's) head dim where it is not Q and K's (0: the same), below it and a
// multiple of 64, 16-bit only: MLA's prefill, 192 / 128 (docs/mla-192-128-design.md).
template <class Element_, int kHeadDim_, int kBlockN_, int kStages_, bool kCausal_, int kQStages_ = 0,
          class OutElement_ = Element_, class QKElement_ = Element_, int kConsumerWarpgroups_ = 2, int kHeadDimV_ = 0>
struct ForwardConfig {
  using Element = Element_;
  using OutElement = OutElement_;
  using QKElement = QKElement_;
  static constexpr bool kFp8 = std::is_same_v<Element, __nv_fp8_e4m3>;
  static constexpr bool kIntScores = std::is_same_v<QKElement, int8_t>;
  static_assert(std::is_same_v<QKElement, Element> || (kFp8 && kIntScores),
                "the S GEMM differs from the P·V GEMM only for INT8 Q and K with FP8");
  static constexpr int kElementBytes = kFp8 ? 1 : 2;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_ > 0 ? kHeadDimV_ : kHeadDim_;
  // Consumer warpgroups, 64 query rows each (one m64 wgmma row block); above d = 256 both on the
  // same 64 rows, each owning half of the head dim (split_head_dim.cuh: its O would not fit in
  // one warpgroup's registers).
  static constexpr int kConsumerWarpgroups = kConsumerWarpgroups_;
  static_assert(kConsumerWarpgroups == 2 || kConsumerWarpgroups == 3, "two or three consumer warpgroups");
  static constexpr bool kSplitHeadDim = kHeadDim_ > 256;
  static constexpr int kBlockM = kSplitHeadDim ? 64 : 64 * kConsumerWarpgroups;
  static constexpr int kOCols = kSplitHeadDim ? kHeadDimV / 2 : kHeadDimV;  // O's columns a consumer holds
  // Whether the consumer warpgroups share their rows (a split head dim: rows 0-63 of the tile,
  // warpgroup w the columns [w kOCols, (w + 1) kOCols)) or each holds its own 64.
  static constexpr bool kSharedRows = kSplitHeadDim;
  // The split head dim's exchange of partial S tiles, one per warpgroup, after SharedStorage.
  static constexpr int kExchangeBytes = kSplitHeadDim ? kConsumerWarpgroups * 64 * kBlockN_ * 4 : 0;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kVarlen = false;  // VarlenConfig: packed variable-length batches
  static constexpr bool kKvCache = false;  // KvCacheConfig: each sequence's own KV cache
  static constexpr bool kEarlyKv = false;  // KvCacheConfig over an E4M3 cache
  // FP8's Vᵀ tile in 16-key slices (KvCacheConfig over an E4M3 cache) instead of one 128-byte
  // swizzled panel row per head-dim row: see KvCacheConfig.
  static constexpr bool kVtSlices = false;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  // Q and K rows are stored as panels of kSwizzleBytes (the width of one swizzled TMA box
  // row): 128 bytes (64 16-bit or 128 FP8 elements), or 64 bytes when a whole row is that
  // short (FP8 at d = 64).
  static constexpr int kRowBytes = kHeadDim * kElementBytes;
  static constexpr int kSwizzleBytes = kRowBytes < 128 ? kRowBytes : 128;
  static constexpr int kPanels = kRowBytes / kSwizzleBytes;
  static constexpr int kVPanels = kHeadDimV * kElementBytes / kSwizzleBytes;  // V's, when 16-bit
  // FP8 descales: one per 128 rows of Q (kFp8BlockRows), so a warpgroup's 64 rows share one
  // even when a work tile has 192 rows; K and V's blocks are the 128-key tiles.
  static constexpr int kDescaleRows = 128;
  static_assert(kDescaleRows % 64 == 0 && (!kFp8 || kBlockN == kDescaleRows), "descale blocks follow the tiles");
  // k steps of the P·V GEMM over one key tile (k16, or k32 for FP8).
  static constexpr int kPvSteps = kBlockN / (kFp8 ? 32 : 16);
  // FP8 P is scaled by 2^6 before its conversion (the e4m3 range reaches 448; P <= 1 would
  // waste it), undone in the LSE; O and the row sums carry the same factor, so it cancels.
  // The lift trades against the stale margin below (P <= 2^(lift + margin) < 448): run 58, in
  // one GPU call on the same data, lift 6 / margin 2.75 against 8 / 0.75: d = 256 N = 16k FP8
  // +1.3%, INT8 Q/K +1.7% (fewer O rescales), d = 64 and 128 within +-1%; RMSE on the outlier
  // data +0.3% E4M3, +1..1.5% INT8 Q/K (P's small values reach e4m3's subnormals 2 binades
  // sooner). WARPATTN_TUNE_FP8_P_LIFT sets it.
#ifndef WARPATTN_TUNE_FP8_P_LIFT
#define WARPATTN_TUNE_FP8_P_LIFT 6
#endif
  static constexpr float kPLog2Offset = kFp8 ? float(WARPATTN_TUNE_FP8_P_LIFT) : 0.f;
  // A row's softmax reference moves only when its max grows by more than this (log2 units;
  // OnlineSoftmax), so P reaches 2^(kPLog2Offset + kStaleLog2): 2^8.75 = 430 under e4m3's 448,
  // 256 in bf16/fp16.
  static constexpr float kStaleLog2 = kFp8 ? 8.75f - kPLog2Offset : 8.f;
  static_assert(!kFp8 || (kStaleLog2 >= 0.f && kPLog2Offset + kStaleLog2 < 8.807f), "P must stay below e4m3's 448");
  // The softmax's schedule against the P·V wait (ConsumerTile::run). ptxas hoists a wgmma
  // wait to the top of its basic block, so where the wait sits is set by schedule fences.
  // d >= 128: the first row's max and exponentials and the second row's max run before the
  // P·V wait; after it, the first row's P is converted while the second row's exponentials
  // run (its F2FPs in the MUFU's gaps), then the second row's. Measured (runs 68-69, A/B in
  // one call, N = 16k) against the previous schedules, the whole softmax under P·V at d = 256
  // (runs 27-29) and one row at a time with the first row's max under P·V at d = 128 (run 50):
  // FP8 E4M3 d = 256 +1.8..2.4%, d = 128 +1.2..1.4%; INT8 Q/K -1..+0.5%; BF16 within +-1%.
  // d = 64: the softmax in one block after the P·V wait (its P·V is short and a third consumer
  // warpgroup hides the softmax's latency; the overlap cost 3.5-5% there, runs 28-29).
#ifndef WARPATTN_TUNE_ROWS_THEN_CONVERT_MIN_D  // the smallest head dim that takes it (to measure)
#define WARPATTN_TUNE_ROWS_THEN_CONVERT_MIN_D 128
#endif
  static constexpr bool kSoftmaxRowsThenConvert = kHeadDim >= WARPATTN_TUNE_ROWS_THEN_CONVERT_MIN_D;
  // setmaxnreg split. The pool is the launch allocation (65,536 registers / threads, in steps
  // of 8): 384 threads x 168 = 64,512 = 128 x 40 + 256 x 232, or 512 x 128 = 65,536 =
  // 128 x 32 + 384 x 160; a split over it makes the consumers' .inc wait forever. The producer
  // needs 40 since it also chooses tiles (24 spilled); the consumers fit in 232 with no spill at
  // every head dim.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr bool kWideConsumers = kFp8 && kHeadDim == 256;
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 3 ? 32 : kWideConsumers ? 24 : 40;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 3 ? 160 : kWideConsumers ? 240 : 232;
  static_assert(128 * kProducerRegisters + 128 * kConsumerWarpgroups * kConsumerRegisters <= kThreads * kLaunchRegisters,
                "setmaxnreg.inc would wait forever for registers the CTA does not have");

  static constexpr int kQTileBytes = kBlockM * kHeadDim * kElementBytes;
  static constexpr int kKTileBytes = kBlockN * kHeadDim * kElementBytes;
  static constexpr int kVTileBytes = kBlockN * kHeadDimV * kElementBytes;  // (FP8: Vᵀ's, the same)
  static constexpr int kSharedMemoryLimit = 227 * 1024;  // per CTA on sm_90
  static constexpr int kQStages =
      kQStages_ > 0 ? kQStages_
                    : (2 * kQTileBytes + kStages * (kKTileBytes + kVTileBytes) + kExchangeBytes + 1024 <= kSharedMemoryLimit
                           ? 2
                           : 1);

  static_assert(kRowBytes % kSwizzleBytes == 0 && (kSwizzleBytes == 128 || kSwizzleBytes == 64),
                "rows are stored as 128- or 64-byte swizzled panels");
  static_assert(kBlockN % (kFp8 ? 32 : 16) == 0, "kBlockN is the K extent of the P·V GEMM");
  static_assert(!kFp8 || kBlockN == 128, "FP8 Vᵀ tiles are one 128-byte panel of keys");
  static_assert(kBlockN <= 256 && kOCols <= 256, "wgmma N is at most 256");
  static_assert(kHeadDimV == kHeadDim || (!kFp8 && !kSplitHeadDim && kHeadDimV < kHeadDim && kHeadDimV % 64 == 0),
                "a V head dim of its own: 16-bit, below Q and K's, whole 64-column panels");
  static_assert(!kSplitHeadDim || (kHeadDim == 512 && kConsumerWarpgroups == 2 && !kFp8),
                "above d = 256: 16-bit d = 512, two warpgroups on halves of the head dim");
};

// The same kernel on a packed variable-length batch: tiles from the device-made plan
// (varlen/plan_varlen.hpp), each with its sequence's offsets and lengths.
template <class Base>
struct VarlenConfig : Base {
  static constexpr bool kVarlen = true;
};

// The same kernel over KV caches (warpattn.hpp, KvCache): pieces of packed-row tiles that the
// producer enumerates itself (decode/kv_cache_pieces.hpp), each sequence's Q, out and lse in its
// own batch entry and its keys in its cache's pages (decode/kv_pages.hpp), loaded in boxes that
// never cross a page.
// An E4M3 cache (Base an Fp8ForwardConfigFor; docs/decode-fp8-cache-design.md) keeps V
// transposed in pages of 16k keys, and its Vᵀ tile is assembled from one TMA box per page (or
// per 128 keys) in wgmma's no-swizzle K-major layout: 16-key slices of head_dim rows x 16 bytes,
// each 8-row group one 128-byte core matrix (kVtSlices; the P·V descriptor in
// consumer_gemms.cuh, the loads in producer.cuh). A 128-byte swizzled panel row spans 128 keys,
// which pages of 16 to 64 keys cannot fill; the slices take any page size that is a multiple of
// 16, and a dense cache is one page per sequence, so one kernel serves both.
template <class Base>
struct KvCacheConfig : VarlenConfig<Base> {
  static constexpr bool kKvCache = true;
  static constexpr bool kVtSlices = Base::kFp8;
  static constexpr bool kEarlyKv = Base::kFp8 && WARPATTN_TUNE_KVCACHE_FP8_EARLY_KV >= 1;
  // E4M3 at d = 256 needs the lean producer: with producer.cuh's KV-cache producer (page
  // look-ups, the pieces' enumeration) that kernel spilled 128-132 bytes in the 24 registers it
  // leaves the producer warpgroup (kWideConsumers: consumers of 240), and its consumers 48-116
  // bytes in 232 with a producer of 40 (2026-12-02). kLeanCacheProducer<Cfg> holds exactly
  // there (decode/lean_cache_producer.cuh: the producer and cache issuers; consumer.cuh's
  // kLeanRegisters: the slot releases and the mask), and the kernel has 0 stack and 0 spills
  // (docs/decode-fp8-cache-design.md, "Head dim 256").
  static_assert(!Base::kFp8 || Base::kHeadDim <= 128 || Base::kHeadDim == 256, "E4M3 caches at head dims 64, 128 and 256");
  static_assert(!Base::kIntScores, "a KV cache's K is E4M3 or 16-bit");
  static_assert(Base::kHeadDimV == Base::kHeadDim, "a KV cache's values have the keys' head dim");
};

}  // namespace warpattn::detail
