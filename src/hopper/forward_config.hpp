// Compile-time shape of one forward kernel instantiation.
#pragma once

namespace warpattn::detail {

// kQStages_: Q buffers (1 or 2; 0 = 2 when shared memory allows). With two, the next work
// tile's Q loads during the whole current tile instead of after its last S GEMM.
template <class Element_, int kHeadDim_, int kBlockN_, int kStages_, bool kCausal_, int kQStages_ = 0>
struct ForwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  // Two consumer warpgroups, 64 query rows each (one m64 wgmma row block).
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kBlockM = 64 * kConsumerWarpgroups;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kCausal = kCausal_;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  // Head dim in 64-element (128-byte) panels: the width of one 128B-swizzled TMA box row.
  static constexpr int kPanels = kHeadDim / 64;
  // setmaxnreg split. The pool is the launch allocation: 384 threads x 168 registers =
  // 64,512 = 128 x 40 + 256 x 232; a split over it makes the consumers' .inc wait forever.
  // The producer needs 40 since it also chooses tiles (24 spilled); the consumers fit in 232
  // with no spill at every head dim.
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= 384 * 168,
                "setmaxnreg.inc would wait forever for registers the CTA does not have");

  static constexpr int kQTileBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * 2;
  static constexpr int kSharedMemoryLimit = 227 * 1024;  // per CTA on sm_90
  static constexpr int kQStages =
      kQStages_ > 0 ? kQStages_
                    : (2 * kQTileBytes + 2 * kStages * kKVTileBytes + 1024 <= kSharedMemoryLimit ? 2 : 1);

  static_assert(kHeadDim % 64 == 0, "head dim is stored as 64-element panels");
  static_assert(kBlockN % 16 == 0, "kBlockN is the K extent of the P·V GEMM (k16 steps)");
  static_assert(kBlockN <= 256 && kHeadDim <= 256, "wgmma N is at most 256");
};

}  // namespace warpattn::detail
