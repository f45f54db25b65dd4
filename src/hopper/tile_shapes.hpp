// Tile shapes per head dimension: the one place where they are chosen.
// kBlockM is fixed at 128 (two consumer warpgroups of 64 rows). Why each kBlockN / stage count:
//  d=64 : 128 x 128, 2 stages. S and P for 128 keys plus a 32-register O fit easily.
//  d=128: 128 x 176 non-causal, 128 x 128 causal, 2 stages (FlashAttention-3's tiles): the
//         wider tile halves nothing but the per-tile overhead, and measured +4% at N=16k
//         non-causal; causal blocks gain nothing from it (more masked work on the diagonal).
//  d=256: 128 x 80, 2 stages: O alone takes 128 registers per thread, and Q 64 KB +
//         2 x (K 40 + V 40) KB = 224 KB is just under the 227 KB shared-memory limit.
// Measured figures behind these choices live in docs/perf/.
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
  static constexpr int kBlockN = kCausal ? 128 : 160, kStages = 2;
};
template <bool kCausal>
struct TileShape<256, kCausal> {
  static constexpr int kBlockN = 64, kStages = 2;
};

template <class Element, int kHeadDim, bool kCausal>
using ForwardConfigFor = ForwardConfig<Element, kHeadDim, TileShape<kHeadDim, kCausal>::kBlockN,
                                       TileShape<kHeadDim, kCausal>::kStages, kCausal>;

}  // namespace warpattn::detail
