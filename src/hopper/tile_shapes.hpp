// Tile shapes per head dimension: the one place where they are chosen (docs/tile-shapes.md
// collects the measurements behind each choice).
// kBlockM is 128 (two consumer warpgroups of 64 rows; tall tiles below: 192). The measurements behind each
// choice are in docs/perf/LOG.md (runs 5-9, bf16, beside cuDNN in the same process):
//  d=64 : 128 x 128, 2 stages, two Q buffers. 128 x 192 gains 1-4% at N=16k but loses 9% at
//         N=1024 (a partial last key tile); a single Q buffer measured the same.
//  d=128: non-causal 128 x 176, 2 stages (FlashAttention-3's tile): +4% over 128 x 128 at
//         N=16k, and +5% over 128 x 160 at N=512 (3 full key tiles instead of 4 partial).
//         Causal 128 x 128 with 3 stages: +2% over 2 stages at N=16k; a wider tile only adds
//         masked work on the diagonal.
//  d=256: 128 x 80, 2 stages: O alone takes 128 registers per thread, and Q 64 KB +
//         2 x (K 40 + V 40) KB = 224 KB is just under the 227 KB shared-memory limit.
//         128 x 64 is 5-8% slower at N >= 2048.
#pragma once

#include "hopper/forward_config.hpp"

namespace warpattn::detail {

template <int kHeadDim, bool kCausal>
struct TileShape;
template <bool kCausal>
struct TileShape<64, kCausal> {
  static constexpr int kBlockN = 128, kStages = 2;
};
template <bool kCausal>
struct TileShape<128, kCausal> {
  static constexpr int kBlockN = kCausal ? 128 : 176, kStages = kCausal ? 3 : 2;
};
template <bool kCausal>
struct TileShape<256, kCausal> {
  static constexpr int kBlockN = 80, kStages = 2;
};
// MLA's prefill, q and k 192 with v 128 (ForwardConfig's kHeadDimV; docs/mla-192-128-design.md):
// S and O take the d = 128 kernel's registers (the S GEMM's depth adds none), so its tile: 128
// keys; Q 48 KB + 2 x (K 48 + V 32) KB = 208 KB (3 stages would not fit, nor 144 keys).
// WARPATTN_TUNE_MLA_BLOCK_N for the A/B: 112, or 96 (2 x 60 KB: room for two Q buffers).
#ifndef WARPATTN_TUNE_MLA_BLOCK_N
#define WARPATTN_TUNE_MLA_BLOCK_N 128
#endif
template <bool kCausal>
struct TileShape<192, kCausal> {
  static constexpr int kBlockN = WARPATTN_TUNE_MLA_BLOCK_N, kStages = 2;
};
// V's head dim where a kernel's differs from Q and K's (0: the same): 192's is 128.
template <int kHeadDim>
inline constexpr int kValueHeadDim = kHeadDim == 192 ? 128 : 0;
// d = 512 (ForwardConfig::kSplitHeadDim: 64 rows, each consumer warpgroup half of the head dim;
// docs/headdim512-design.md): Q 64 KB + K 64 KB + V 64 KB + the S exchange 32 KB = 224 KB, one
// stage each (K and V on barriers of their own, so the next K loads under this tile's P·V).
template <bool kCausal>
struct TileShape<512, kCausal> {
  static constexpr int kBlockN = 64, kStages = 1;
};

// Three consumer warpgroups (192-row work tiles) pay where the softmax, not the GEMMs, is the
// work — d = 64, one exponential per 256 FLOP — and the sequence fills the taller tiles; they
// are chosen at run time from kTallTileMinRows query rows on. Run 44 (BF16, 128 x 96 tiles,
// beside cuDNN): +7..12% at N >= 4096, -5% (causal -10%) at N = 1024, whose last 192-row
// tile is a third full. Runs 43/44, FP8 (128-key tiles): +15..23% at N = 16k. BF16/FP16 keys
// come 112 at a time: with 128 the precise path's P in two parts spills out of 160 registers;
// run 48 beside 96 (WARPATTN_TUNE_TALL_BLOCK_N): BF16 N = 16k +4%, causal +4%, N = 4096 +1..2%;
// FP16 -1..+2%.
// WARPATTN_TUNE_TALL_MIN_ROWS moves the threshold for an A/B (scripts/ab_fp8.sh with AB_BENCH):
// run 139 found packed short batches faster on the tall tiles, which dense N = 1024 may share.
#ifndef WARPATTN_TUNE_TALL_MIN_ROWS
#define WARPATTN_TUNE_TALL_MIN_ROWS 2048
#endif
inline constexpr int64_t kTallTileMinRows = WARPATTN_TUNE_TALL_MIN_ROWS;
template <int kHeadDim>
inline constexpr bool kHasTallTiles = kHeadDim == 64;
#ifndef WARPATTN_TUNE_TALL_BLOCK_N
#define WARPATTN_TUNE_TALL_BLOCK_N 112
#endif
template <int kHeadDim, bool kCausal>
struct TallTileShape {  // used where kHasTallTiles
  static constexpr int kBlockN = WARPATTN_TUNE_TALL_BLOCK_N, kStages = 2, kWarpgroups = 3;
};

// FP8: 128-key tiles (Vᵀ's 128-byte panel); 1-byte operands leave room for two Q buffers and,
// at d=64 and 128, three stages. For tuning runs (scripts/ab_fp8.sh): WARPATTN_TUNE_FP8_STAGES
// sets the stages at d = 64 and 128, _STAGES_D256 at d = 256 (where more than 2 do not fit
// with two Q buffers), _QSTAGES the Q buffers.
#ifndef WARPATTN_TUNE_FP8_STAGES
#define WARPATTN_TUNE_FP8_STAGES 3
#endif
#ifndef WARPATTN_TUNE_FP8_STAGES_D256
#define WARPATTN_TUNE_FP8_STAGES_D256 2
#endif
#ifndef WARPATTN_TUNE_FP8_QSTAGES
#define WARPATTN_TUNE_FP8_QSTAGES 0
#endif
template <int kHeadDim>
inline constexpr int kFp8Stages = kHeadDim == 256 ? WARPATTN_TUNE_FP8_STAGES_D256 : WARPATTN_TUNE_FP8_STAGES;
// QKElement: __nv_fp8_e4m3, or int8_t for INT8 Q and K (the same tiles: 1-byte operands).
// kWarpgroups 3: the tall tiles (192 x 128; see kTallTileMinRows). (The E4M3 KV cache takes the
// same 3 stages: 5 and 6 measured the same, run 188.)
template <int kHeadDim, bool kCausal, class OutElement, class QKElement, int kWarpgroups = 2>
using Fp8ForwardConfigFor = ForwardConfig<__nv_fp8_e4m3, kHeadDim, 128, kFp8Stages<kHeadDim>, kCausal,
                                          WARPATTN_TUNE_FP8_QSTAGES, OutElement, QKElement, kWarpgroups>;

// Sliding windows narrower than kTallTileMinBand on kernels of their own (forward_instance.cuh),
// whose key tiles are 64 keys: each warpgroup walks its own tiles (consumer.cuh's
// kWarpgroupKeyTiles), 5 of them (320 keys a row) for a 256-key window, where the 128-key tiles
// take 384 and d = 256's 80-key tiles ~400. A head dim's knob sets the keys a tile (0: none,
// the banded kernel takes them); d = 64's also its consumer warpgroups (3: 192-row work tiles,
// more warps to hide the softmax's latency, which is d = 64's work).
// Run 202 (BF16, causal, 256-key window, H d = 2048; 2 passes of 3 interleaved beside cuDNN's
// window, warpattn/cuDNN at N = 16K / 64K / 128K): d = 64 on two warpgroups 0.96 / 0.96 / 0.97,
// on three 1.08 / 1.09 / 1.10; d = 128 on 128-key tiles 1.05 / 1.03 / 1.00, on 64 1.04 / 1.06 /
// 1.05; d = 256 on 80-key tiles 1.07 / 1.01 / 0.99, on 64 1.16 / 1.13 / 1.13. (Run 194: d = 64's
// 64-key tiles had taken it from 0.877 to 0.966 at 16K; run 184: the same tiles in the kernel
// short causal sequences share cost those 6.6%, hence a kernel of its own.) Stages: the shared
// memory's fill (Q's two buffers and 4 x 16 or 32 KB of keys and values, or at d = 256 one Q
// buffer and 2 x 64 KB).
#ifndef WARPATTN_TUNE_D64_NARROW_BLOCK_N
#define WARPATTN_TUNE_D64_NARROW_BLOCK_N 64
#endif
#ifndef WARPATTN_TUNE_D64_NARROW_WARPGROUPS
#define WARPATTN_TUNE_D64_NARROW_WARPGROUPS 3
#endif
#ifndef WARPATTN_TUNE_D128_NARROW_BLOCK_N
#define WARPATTN_TUNE_D128_NARROW_BLOCK_N 64
#endif
#ifndef WARPATTN_TUNE_D256_NARROW_BLOCK_N
#define WARPATTN_TUNE_D256_NARROW_BLOCK_N 64
#endif
template <int kHeadDim>
struct NarrowTileShape {
  static constexpr int kBlockN = 0, kStages = 0, kWarpgroups = 2;
};
template <>
struct NarrowTileShape<64> {
  static constexpr int kBlockN = WARPATTN_TUNE_D64_NARROW_BLOCK_N, kStages = kBlockN == 64 ? 4 : 2,
                       kWarpgroups = WARPATTN_TUNE_D64_NARROW_WARPGROUPS;
};
template <>
struct NarrowTileShape<128> {
  static constexpr int kBlockN = WARPATTN_TUNE_D128_NARROW_BLOCK_N, kStages = kBlockN == 64 ? 4 : 2, kWarpgroups = 2;
};
template <>
struct NarrowTileShape<256> {
  static constexpr int kBlockN = WARPATTN_TUNE_D256_NARROW_BLOCK_N, kStages = 2, kWarpgroups = 2;
};
template <int kHeadDim>
inline constexpr bool kHasNarrowTiles = NarrowTileShape<kHeadDim>::kBlockN > 0;
template <class Element, int kHeadDim>
using NarrowForwardConfigFor =
    ForwardConfig<Element, kHeadDim, (kHasNarrowTiles<kHeadDim> ? NarrowTileShape<kHeadDim>::kBlockN : 128),
                  (kHasNarrowTiles<kHeadDim> ? NarrowTileShape<kHeadDim>::kStages : 2), true, 0, Element, Element,
                  NarrowTileShape<kHeadDim>::kWarpgroups>;
template <class Element, int kHeadDim, bool kCausal>
using ForwardConfigFor = ForwardConfig<Element, kHeadDim, TileShape<kHeadDim, kCausal>::kBlockN,
                                       TileShape<kHeadDim, kCausal>::kStages, kCausal, 0, Element, Element, 2,
                                       kValueHeadDim<kHeadDim>>;
// KV caches (decode, run_kvcache.cuh): the banded tile's shape whatever the mask, so that a key
// tile is a power of two keys where the dense forward's is not (176 at d = 128): a paged cache's
// key tile then comes in one box per panel from pages of 128 keys up (kv_pages.hpp's boxes are the
// largest power of two dividing both), where 176-key tiles took 11 boxes of 16 keys per panel
// (run 122: paged 18-57% slower than dense). d = 128: 128 x 128, 3 stages (192 KB of keys and
// values in flight against 180); d = 64 and 256 are the dense forward's tiles already.
template <class Element, int kHeadDim, bool kBanded>
using KvCacheForwardConfigFor = ForwardConfig<Element, kHeadDim, TileShape<kHeadDim, true>::kBlockN,
                                              TileShape<kHeadDim, true>::kStages, kBanded>;
template <class Element, int kHeadDim, bool kCausal>
using TallForwardConfigFor =
    ForwardConfig<Element, kHeadDim, TallTileShape<kHeadDim, kCausal>::kBlockN, TallTileShape<kHeadDim, kCausal>::kStages,
                  kCausal, 0, Element, Element, TallTileShape<kHeadDim, kCausal>::kWarpgroups>;

}  // namespace warpattn::detail
