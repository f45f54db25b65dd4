// Shared by the probes here: one mbarrier for the TMA loads, initialised by thread 0, and the
// first 1024-byte-aligned address of the dynamic shared memory (the swizzle atoms' alignment).
#pragma once
#include "common.cuh"

__device__ __forceinline__ uint32_t init_barrier_and_tile_base(uint8_t* smem_raw, uint64_t* bar) {
  const uint32_t raw = smem_u32(smem_raw);
  if (threadIdx.x == 0) { mbar_init(smem_u32(bar), 1); fence_barrier_init(); }
  __syncthreads();
  return (raw + 1023u) & ~1023u;
}
