// Shared-memory layout of the forward kernel: Q once, a ring of K and V stages, barriers.
// Every tile is a stack of 64-column panels, [panel][row][128 B], 128B-swizzled by TMA and
// 1024-byte aligned so the swizzle's row phase is the row index mod 8.
#pragma once
#include <cstdint>

#include "hopper/tile_scheduler.cuh"

namespace warpattn::detail {

template <class Cfg>
struct SharedStorage {
  alignas(1024) uint8_t q[Cfg::kQStages][Cfg::kQTileBytes];
  alignas(1024) uint8_t k[Cfg::kStages][Cfg::kKTileBytes];
  alignas(1024) uint8_t v[Cfg::kStages][Cfg::kVTileBytes];
  alignas(8) uint64_t q_full[Cfg::kQStages];
  uint64_t q_empty[Cfg::kQStages];  // both consumers' last S GEMM of a tile has read it
  uint64_t k_full[Cfg::kStages];
  uint64_t k_empty[Cfg::kStages];
  uint64_t v_full[Cfg::kStages];
  uint64_t v_empty[Cfg::kStages];
  TileSlots tiles;
};

// Cfg::kExchangeBytes after SharedStorage (16-byte aligned) for the consumer warpgroups'
// exchange (a split head dim's partial S, split_head_dim.cuh). kForwardSmemBytes: the launch's
// dynamic shared memory.
template <class Cfg>
inline constexpr size_t kExchangeOffset = (sizeof(SharedStorage<Cfg>) + 15) / 16 * 16;
template <class Cfg>
inline constexpr int kForwardSmemBytes = static_cast<int>(Cfg::kExchangeBytes > 0 ? kExchangeOffset<Cfg> + Cfg::kExchangeBytes
                                                                                 : sizeof(SharedStorage<Cfg>));
template <class Cfg>
__device__ __forceinline__ float* exchange_buffer(SharedStorage<Cfg>& ss) {
  return reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(&ss) + kExchangeOffset<Cfg>);
}

}  // namespace warpattn::detail
