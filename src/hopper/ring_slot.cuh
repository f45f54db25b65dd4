// Where the it-th tile of a kernel's life goes in a ring of shared-memory stages, and which
// mbarrier phase marks it.
#pragma once
#include <cstdint>

namespace warpattn::detail {

struct RingSlot {
  int stage;
  uint32_t phase;
};

// Tile ordinal `it` (>= 0) maps to stage it % S, and the barrier phase flips every time the
// stage index wraps. Unsigned: no sign fix-ups around the division.
template <int kStages>
__device__ __forceinline__ RingSlot ring_slot(int it) {
  const uint32_t u = static_cast<uint32_t>(it);
  return {static_cast<int>(u % kStages), (u / kStages) & 1u};
}

}  // namespace warpattn::detail
