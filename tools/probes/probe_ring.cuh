// The ring the TMA stream probes share (p_tma_issue_rate.cu, p_vt_slices_rate.cu,
// p_kv_layout_rate.cu): kStages tiles in the 1024-byte-aligned start of dynamic shared memory,
// a full and an empty mbarrier a stage after them.
#pragma once
#include <cstdint>

#include "hopper/ptx/mbarrier.cuh"

template <int kStages>
struct ProbeRing {
  uint64_t full[kStages], empty[kStages];

  // The ring after `tile_bytes` of stages in smem_raw (dynamic shared memory, 1024 bytes of slack
  // for the alignment); thread 0 initialises its barriers (full: `full_arrivals` a phase, empty:
  // one) and the whole CTA waits for that.
  static __device__ __forceinline__ ProbeRing& make(uint8_t* smem_raw, uint8_t*& base, int tile_bytes,
                                                    int full_arrivals) {
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    ProbeRing& ring = *reinterpret_cast<ProbeRing*>(base + kStages * tile_bytes);
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        warpattn::ptx::mbarrier_init(warpattn::ptx::smem_addr(&ring.full[s]), full_arrivals);
        warpattn::ptx::mbarrier_init(warpattn::ptx::smem_addr(&ring.empty[s]), 1);
      }
      warpattn::ptx::fence_barrier_init();
    }
    __syncthreads();
    return ring;
  }
};
