// Can a second warp read a dQ block right after the last bulk reduce-add into it, the adds
// published late? The premise of the dQ conversion inside the backward's main kernel
// (docs/backward-design.md, "The next lever, designed"): each key block's writer thread adds
// its pieces by cp.reduce.async.bulk, publishes a piece's add two pieces later
// (cp.async.bulk.wait_group 2, fence.proxy.async.global, an atomic add with release to the
// block's counter), and the writer whose add brings the counter to its total hands the block to
// another warp of its CTA, which takes the counter with acquire and reads the block with plain
// loads. The deterministic mode publishes each add at once (wait_group 0) and its readers are
// the next adders, not plain loads; this checks the plain reader.
//
// kAdders CTAs each add a 16 KB piece (4096 floats, all equal to the CTA's index + 1) into each
// of kTiles tiles, every CTA starting at its own tile (as key blocks would walk query blocks),
// so that a tile's adds come from many SMs at about the same time. A tile's total is kAdders
// adds; its last adder's CTA records it, and after the loop warp 1 of that CTA takes the
// counter with ld.acquire.gpu and sums the tile with plain loads, against kAdders (kAdders + 1)
// / 2 per float. Variants: the fence.proxy.async.global before the release (as designed) or
// not; publication lagged by two pieces (wait_group 2) or at once (wait_group 0). Reported per
// variant: tiles read, floats wrong, and the time of the adds. FAIL if the designed variant
// reads a wrong float.
// Build and run on the GPU host from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_dq_publish \
//     tools/probes/p_dq_publish.cu && timeout 60 /tmp/p_dq_publish
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/memory_order.cuh"
#include "hopper/ptx/tma.cuh"

namespace {

constexpr int kAdders = 132, kTiles = 64, kFloats = 4096;
constexpr int kThreads = 64;  // warp 0: the writer thread; warp 1: the reader

__device__ __forceinline__ int add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

template <bool kProxyFence, int kLag>
__global__ void __launch_bounds__(kThreads) adders(float* tiles, int* counters, unsigned long long* wrong) {
  using namespace warpattn::ptx;
  __shared__ alignas(128) float piece[kFloats];
  __shared__ int last_tiles[kTiles];
  __shared__ int last_count;
  const float mine = static_cast<float>(blockIdx.x + 1);
  for (int i = threadIdx.x; i < kFloats; i += kThreads) piece[i] = mine;
  if (threadIdx.x == 0) last_count = 0;
  fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    const auto publish = [&](int k) {
      const int tile = (static_cast<int>(blockIdx.x) + k) % kTiles;
      if (kProxyFence) fence_proxy_async_global();
      if (add_acq_rel_gpu(counters + tile, 1) + 1 == kAdders) last_tiles[last_count++] = tile;
    };
    for (int k = 0; k < kTiles; ++k) {
      const int tile = (static_cast<int>(blockIdx.x) + k) % kTiles;
      bulk_reduce_add_f32(tiles + static_cast<int64_t>(tile) * kFloats, smem_addr(piece), kFloats * 4);
      tma_store_commit();
      if (k >= kLag) {  // the add kLag pieces back has completed once at most kLag groups are pending
        if constexpr (kLag == 2) asm volatile("cp.async.bulk.wait_group 2;" ::: "memory");
        else bulk_wait_all();
        publish(k - kLag);
      }
    }
    bulk_wait_all();
    for (int k = kTiles - kLag; k < kTiles; ++k) publish(k);
  }
  __syncthreads();  // the last tiles' list
  if (threadIdx.x >= 32) {
    const int lane = threadIdx.x - 32;
    const float want = static_cast<float>(kAdders) * (kAdders + 1) / 2;
    for (int j = 0; j < last_count; ++j) {
      const int tile = last_tiles[j];
      while (load_acquire_gpu(counters + tile) < kAdders) {
      }
      unsigned long long bad = 0;
      for (int i = lane; i < kFloats; i += 32)
        if (tiles[static_cast<int64_t>(tile) * kFloats + i] != want) ++bad;
      if (bad != 0) atomicAdd(wrong, bad);
    }
  }
}

template <bool kProxyFence, int kLag>
bool run(const char* name, float* tiles, int* counters, unsigned long long* wrong, int rounds) {
  unsigned long long total_wrong = 0;
  float ms_total = 0.f;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int r = 0; r < rounds; ++r) {
    cudaMemset(tiles, 0, sizeof(float) * kTiles * kFloats);
    cudaMemset(counters, 0, sizeof(int) * kTiles);
    cudaMemset(wrong, 0, sizeof(unsigned long long));
    cudaEventRecord(a);
    adders<kProxyFence, kLag><<<kAdders, kThreads>>>(tiles, counters, wrong);
    cudaEventRecord(b);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("FAIL: %s: %s\n", name, cudaGetErrorString(cudaGetLastError()));
      return false;
    }
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    ms_total += ms;
    unsigned long long w = 0;
    cudaMemcpy(&w, wrong, sizeof(w), cudaMemcpyDeviceToHost);
    total_wrong += w;
  }
  std::printf("%-34s rounds %d, tiles read %d, floats wrong %llu, %.1f us a launch\n", name, rounds, rounds * kTiles,
              total_wrong, 1000.f * ms_total / rounds);
  return total_wrong == 0;
}

}  // namespace

int main() {
  float* tiles = nullptr;
  int* counters = nullptr;
  unsigned long long* wrong = nullptr;
  cudaMalloc(&tiles, sizeof(float) * kTiles * kFloats);
  cudaMalloc(&counters, sizeof(int) * kTiles);
  cudaMalloc(&wrong, sizeof(unsigned long long));
  const int rounds = 2000;
  const bool designed = run<true, 2>("fence, publication 2 pieces late", tiles, counters, wrong, rounds);
  run<true, 0>("fence, publication at once", tiles, counters, wrong, rounds);
  run<false, 2>("no fence, publication 2 pieces late", tiles, counters, wrong, rounds);
  run<false, 0>("no fence, publication at once", tiles, counters, wrong, rounds);
  std::printf(designed ? "PASS: the designed publication read every float right\n"
                       : "FAIL: the designed publication read a wrong float\n");
  return designed ? 0 : 1;
}
