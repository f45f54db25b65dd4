// The ring the stream probes share (p_tma_issue_rate.cu, p_vt_slices_rate.cu,
// p_kv_layout_rate.cu, p_stream_order.cu): kStages tiles in the 1024-byte-aligned start of dynamic shared memory,
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

  // The consumer warp of a K + V stream (p_kv_layout_rate.cu, p_stream_order.cu): waits for each
  // of its `tiles` stages and frees it; of the last, it sums the K and the V tile's 16-bit values
  // (tile_bytes each, V after K; sums are swizzle-invariant) into last_sums[2 cta], [2 cta + 1].
  __device__ __forceinline__ void consume_and_sum_last(const uint8_t* base, int stage_bytes, int tile_bytes, int tiles,
                                                       unsigned long long* last_sums) {
    const int lane = threadIdx.x % 32;
    for (int t = 0; t < tiles; ++t) {
      const int stage = t % kStages, phase = (t / kStages) & 1;
      warpattn::ptx::mbarrier_wait(warpattn::ptx::smem_addr(&full[stage]), phase);
      if (t == tiles - 1) {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(base + stage * stage_bytes);
        unsigned long long k_sum = 0, v_sum = 0;
        for (int i = lane; i < tile_bytes / 2; i += 32) k_sum += src[i], v_sum += src[tile_bytes / 2 + i];
        for (int o = 16; o > 0; o /= 2) k_sum += __shfl_xor_sync(~0u, k_sum, o), v_sum += __shfl_xor_sync(~0u, v_sum, o);
        if (lane == 0) last_sums[2 * blockIdx.x] = k_sum, last_sums[2 * blockIdx.x + 1] = v_sum;
      }
      __syncwarp();
      if (lane == 0) warpattn::ptx::mbarrier_arrive(warpattn::ptx::smem_addr(&empty[stage]));
    }
  }
};
