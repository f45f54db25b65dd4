// The producer warpgroup: one thread streams Q once and the K/V tiles of one query block
// through the ring, in the order the consumers use them (last tile first; K_j before
// V_{j+1} so the next S GEMM can start before the previous P·V has its operand).
#pragma once

#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/shared_storage.cuh"

namespace warpattn::detail {

struct RingSlot {
  int stage;
  uint32_t phase;
};

// Tile ordinal `it` of a kernel's life maps to ring stage it % S, and the barrier phase flips
// every time the stage index wraps.
template <int kStages>
__device__ __forceinline__ RingSlot ring_slot(int it) {
  return {it % kStages, static_cast<uint32_t>((it / kStages) & 1)};
}

template <class Cfg>
__device__ __forceinline__ void load_kv_tile(SharedStorage<Cfg>& ss, const CUtensorMap* map,
                                             uint8_t (&tiles)[Cfg::kStages][Cfg::kKVTileBytes],
                                             uint64_t (&full)[Cfg::kStages],
                                             uint64_t (&empty)[Cfg::kStages], int it, int n_block,
                                             int head_kv, int batch) {
  using namespace ptx;
  const RingSlot slot = ring_slot<Cfg::kStages>(it);
  // The slot's previous occupant was released in the phase before this one; on the first lap
  // the "preceding phase" of a fresh barrier counts as complete.
  mbarrier_wait(smem_addr(&empty[slot.stage]), slot.phase ^ 1);
  const uint32_t bar = smem_addr(&full[slot.stage]);
  mbarrier_arrive_expect_tx(bar, Cfg::kKVTileBytes);  // the full box, even past seqlen_k
  tma_load_5d(smem_addr(tiles[slot.stage]), map, bar, 0, n_block * Cfg::kBlockN, 0, head_kv,
              batch);
}

template <class Cfg>
__device__ __forceinline__ void run_producer(SharedStorage<Cfg>& ss, const CUtensorMap* tm_q,
                                             const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                             int m_block, int head, int head_kv, int batch,
                                             int n_tiles) {
  using namespace ptx;
  if (n_tiles <= 0) return;
  const uint32_t q_bar = smem_addr(&ss.q_full);
  mbarrier_arrive_expect_tx(q_bar, Cfg::kQTileBytes);
  tma_load_5d(smem_addr(ss.q), tm_q, q_bar, 0, m_block * Cfg::kBlockM, 0, head, batch);

  load_kv_tile<Cfg>(ss, tm_k, ss.k, ss.k_full, ss.k_empty, 0, n_tiles - 1, head_kv, batch);
  for (int it = 1; it < n_tiles; ++it) {
    load_kv_tile<Cfg>(ss, tm_k, ss.k, ss.k_full, ss.k_empty, it, n_tiles - 1 - it, head_kv, batch);
    load_kv_tile<Cfg>(ss, tm_v, ss.v, ss.v_full, ss.v_empty, it - 1, n_tiles - it, head_kv, batch);
  }
  load_kv_tile<Cfg>(ss, tm_v, ss.v, ss.v_full, ss.v_empty, n_tiles - 1, 0, head_kv, batch);
}

}  // namespace warpattn::detail
