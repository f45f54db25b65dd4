// Acquire/release on global counters and the proxy fence between ordinary and bulk (async
// proxy) accesses: the deterministic backward's turns. And the relaxed vector add into global
// memory that the backward's dQ takes from registers.
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

// dst[0 .. 3] += v, element-wise atomic in L2, relaxed (no result: the thread does not wait).
// dst 16-byte aligned.
__device__ __forceinline__ void red_add_v4_f32(float* dst, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

}  // namespace warpattn::ptx
