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

}  // namespace warpattn::detail
