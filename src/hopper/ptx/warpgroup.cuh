// Warpgroup-level PTX: register reallocation (setmaxnreg), named barriers, wgmma
// fence/commit/wait and the shared-memory matrix descriptor.
#pragma once
#include <cstdint>

#include "hopper/ptx/arch_guard.cuh"

namespace warpattn::ptx {

// setmaxnreg: N must be a multiple of 8 in [24, 256]; all warps of the warpgroup execute it.
template <int N>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void acquire_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

// elect.sync over the full warp: true in one lane (every lane must call it), a predicate
// rather than a thread index compared.
__device__ __forceinline__ bool elect_one() {
  uint32_t one;
  asm volatile(
      "{\n"
      " .reg .pred p;\n"
      " elect.sync _|p, 0xffffffff;\n"
      " selp.u32 %0, 1, 0, p;\n"
      "}"
      : "=r"(one));
  return one != 0;
}

// Named barriers (bar.sync / bar.arrive). Id 0 is __syncthreads; the thread count is a
// multiple of 32. The id comes from a register because it depends on the consumer
// warpgroup; ptxas then reserves all 16 ids, which costs nothing at one CTA per SM.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

// Keeps the compiler from moving accesses of registers that an in-flight wgmma owns across
// fence/wait (the asm names no registers otherwise).
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int M, int N>
__device__ __forceinline__ void pin(uint32_t (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) pin(r[i]);
}

// Ends ptxas's basic block here: code before the fence cannot be scheduled after what follows
// it. ptxas moves a wgmma wait up to the top of its block, above independent arithmetic meant
// to run while the wgmma does; put the fence between them. `zero` must be 0 at run time and
// unknown at compile time (a kernel parameter), so the branch exists but is never taken.
__device__ __forceinline__ void schedule_fence(uint32_t zero) {
#ifndef WARPATTN_TUNE_NO_SCHEDULE_FENCE  // to measure what it buys
  if (zero) asm volatile("trap;");
#endif
}

// Shared-memory matrix descriptor for a swizzled operand (sm_90 layout type 1 = 128-byte,
// 2 = 64-byte swizzle). Byte offsets: lbo = leading-dimension offset, sbo = stride between
// 8-row groups (8 x the swizzle width for a K-major tile). The base-offset field stays 0
// (measured exact for TMA-written tiles).
__device__ __forceinline__ uint64_t make_smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                                   int swizzle_bytes) {
  const uint64_t layout = swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : 3;
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (layout << 62);
}

// The same for a no-swizzle operand (layout 0, "interleave"): core matrices of 8 rows x 16
// bytes (128 contiguous bytes), lbo between core matrices along K, sbo between 8-row groups
// along M or N. tools/probes/p_fp8_vt_pages.cu checked it on the H200 (run 146).
__device__ __forceinline__ uint64_t make_plain_smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32);
}

}  // namespace warpattn::ptx
