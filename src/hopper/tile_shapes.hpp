// Tile shapes per head dimension: the one place where they are chosen (docs/tile-shapes.md
// collects the measurements behind each choice).
// kBlockM is 128 (two consumer warpgroups of 64 rows; FP8 d=64: 192, three). The measurements behind each
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
// kWarpgroups: consumer warpgroups. Three at d=64 spill with BF16/FP16 (the precise path's P
// in two parts does not fit in 160 registers).
template <bool kCausal>
struct TileShape<64, kCausal> {
  static constexpr int kBlockN = 128, kStages = 2, kWarpgroups = 2;
};
template <bool kCausal>
struct TileShape<128, kCausal> {
  static constexpr int kBlockN = kCausal ? 128 : 176, kStages = kCausal ? 3 : 2, kWarpgroups = 2;
};
template <bool kCausal>
struct TileShape<256, kCausal> {
  static constexpr int kBlockN = 80, kStages = 2, kWarpgroups = 2;
};

// FP8: 128-key tiles (Vᵀ's 128-byte panel); 1-byte operands leave room for two Q buffers and,
// at d=64 and 128, three stages. WARPATTN_TUNE_FP8_STAGES / _QSTAGES override both head dims for
// tuning runs (scripts/bench_fp8_variant.sh).
#ifndef WARPATTN_TUNE_FP8_STAGES
#define WARPATTN_TUNE_FP8_STAGES 0
#endif
#ifndef WARPATTN_TUNE_FP8_QSTAGES
#define WARPATTN_TUNE_FP8_QSTAGES 0
#endif
template <int kHeadDim>
inline constexpr int kFp8Stages = WARPATTN_TUNE_FP8_STAGES > 0 ? WARPATTN_TUNE_FP8_STAGES : (kHeadDim == 256 ? 2 : 3);
// d=64: three consumer warpgroups (192 x 128 tiles). There the exponentials, not the GEMMs, are
// the work (one per 256 FLOP), and two warps per scheduler could not keep the MUFU busy
// (run 41: 474 TFLOP/s, the MUFU ~half used); O and S fit in 160 registers.
#ifndef WARPATTN_TUNE_FP8_D64_WARPGROUPS
#define WARPATTN_TUNE_FP8_D64_WARPGROUPS 3
#endif
template <int kHeadDim>
inline constexpr int kFp8ConsumerWarpgroups = kHeadDim == 64 ? WARPATTN_TUNE_FP8_D64_WARPGROUPS : 2;
// QKElement: __nv_fp8_e4m3, or int8_t for INT8 Q and K (the same tiles: 1-byte operands).
template <int kHeadDim, bool kCausal, class OutElement, class QKElement>
using Fp8ForwardConfigFor = ForwardConfig<__nv_fp8_e4m3, kHeadDim, 128, kFp8Stages<kHeadDim>, kCausal,
                                          WARPATTN_TUNE_FP8_QSTAGES, OutElement, QKElement,
                                          kFp8ConsumerWarpgroups<kHeadDim>>;

template <class Element, int kHeadDim, bool kCausal>
using ForwardConfigFor = ForwardConfig<Element, kHeadDim, TileShape<kHeadDim, kCausal>::kBlockN,
                                       TileShape<kHeadDim, kCausal>::kStages, kCausal, 0, Element, Element,
                                       TileShape<kHeadDim, kCausal>::kWarpgroups>;

}  // namespace warpattn::detail
