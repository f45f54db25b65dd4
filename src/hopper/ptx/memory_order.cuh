// Acquire/release on global counters and the proxy fence between ordinary and bulk (async
// proxy) accesses: the deterministic backward's turns.
#pragma once
#include "hopper/ptx/arch_guard.cuh"

namespace warpattn::ptx {

__device__ __forceinline__ int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release_gpu(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Orders this thread's ordinary global accesses against its bulk copies and reductions.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

}  // namespace warpattn::ptx
