// Why a decode step's stream is slower than plain loads of the same bytes (issue 16): on an
// H100 the bare TMA ring of p_kv_layout_rate.cu read B = 8 4K's 134 MB in 58-61 us, plain
// 16-byte loads (p_read_rate.cu) 128 MB in 52 us, and cuDNN's decode kernel (an sm80 kernel,
// cp.async and mma.sync; run 248's trace) takes 57.1 us at B = 8 4K and 99.3 at B = 1 64K
// against our attention kernel's 59.5 and 102.7. Two differences between the ring and the plain
// loads, measured apart here on the same bytes through the same 3-stage ring of 64 KB stages
// (K and V tiles of 128 keys x d = 128, BF16), one waiting consumer warp:
//   loader       TMA (one thread, four 16 KB boxes a stage, as the kernel) or cp.async (the
//                128 threads of a producer warpgroup, 16 bytes each, 32 a thread a stage,
//                completing on the full barrier through cp.async.mbarrier.arrive.noinc);
//   (and TMA under an L2 evict-first policy: the step's bytes replace each other, not the lines
//   the flush before it left dirty, which plain loads marked streaming (ld.global.cs) also spare)
//   assignment   contiguous (CTA c takes the launch's tiles c n .. c n + n - 1, as a piece of
//                split keys does) or interleaved (CTA c takes tiles c, c + G, c + 2G, ...: every
//                CTA walks the same region of memory at the same time).
// Each at the B = 8 4K step's 134 MB (2048 tiles) and B = 1 64K's 268 MB (4096), on 128 CTAs
// (the kernel's grid there) and, interleaved, 132. Tiles are contiguous 32 KB (the (B, Hkv, S, d)
// layout: run 195 found the layout makes no difference). Reported: us (best of 6 runs, L2
// flushed by a 256 MB memset before each), the rate against the copy rate of the same run;
// checked: each CTA's last K and V tile's sum against the host's (FAIL on a difference).
// `clean` (the first argument): the memset is followed by a read of another 256 MB, so that each
// run finds the L2 full of clean lines, not the ~L2 of dirty ones a memset leaves (run 251:
// cuDNN's decode kernel took 46.2 us at B = 8 4K after such a flush, 56.6 after the memset
// alone, ours 52.7 and 55.8); then TMA and cp.async, contiguous, also on 512 and 2048 CTAs
// (several waves, which the hardware hands out as CTAs finish, as a non-persistent kernel's).
// Build and run from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_order \
//     tools/probes/p_stream_order.cu -lcuda && timeout 60 /tmp/p_order [clean]
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "probe_host.hpp"
#include "probe_ring.cuh"

namespace ptx = warpattn::ptx;

constexpr int kStages = 3, kTileBytes = 128 * 256, kStageBytes = 2 * kTileBytes, kProducers = 128;
constexpr int kSmem = 1024 + kStages * kStageBytes + 256;
constexpr int kMaxTiles = 4096;

__host__ __device__ inline uint16_t value(int which, long long i) {
  return static_cast<uint16_t>(((static_cast<uint32_t>(i) ^ (which ? 0x5bd1e995u : 0u)) * 2654435761u) >> 16);
}
__global__ void fill(uint16_t* k, uint16_t* v, long long n) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) k[i] = value(0, i), v[i] = value(1, i);
}

// The t-th tile a CTA takes.
__host__ __device__ inline int tile_of(bool interleaved, int cta, int grid, int tiles, int t) {
  return interleaved ? cta + t * grid : static_cast<int>(1LL * cta * tiles / grid) + t;
}
__host__ __device__ inline int tiles_of(bool interleaved, int cta, int grid, int tiles) {
  return interleaved ? (tiles - cta + grid - 1) / grid
                     : static_cast<int>((cta + 1LL) * tiles / grid - 1LL * cta * tiles / grid);
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

template <bool kTma, bool kInterleaved, bool kEvictFirst = false>
__global__ void __launch_bounds__(256, 1) stream(const __grid_constant__ CUtensorMap k_map,
                                                 const __grid_constant__ CUtensorMap v_map, const uint8_t* k,
                                                 const uint8_t* v, int tiles, unsigned long long* last_sums) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base;
  ProbeRing<kStages>& ring = ProbeRing<kStages>::make(smem_raw, base, kStageBytes, kTma ? 1 : kProducers);
  const int cta = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);
  const int mine = tiles_of(kInterleaved, cta, grid, tiles);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x < kProducers) {
    if (kTma && threadIdx.x != 0) return;
    for (int t = 0; t < mine; ++t) {
      const int stage = t % kStages, phase = (t / kStages) & 1;
      const long long row0 = 128LL * tile_of(kInterleaved, cta, grid, tiles, t);
      const uint32_t k_dst = ptx::smem_addr(base + stage * kStageBytes), v_dst = k_dst + kTileBytes;
      const uint32_t full = ptx::smem_addr(&ring.full[stage]);
      ptx::mbarrier_wait(ptx::smem_addr(&ring.empty[stage]), phase ^ 1);
      if constexpr (kTma) {
        ptx::mbarrier_arrive_expect_tx(full, kStageBytes);
        for (int p = 0; p < 2; ++p) {
          if constexpr (kEvictFirst) {
            const uint64_t policy = ptx::l2_evict_first_policy();
            ptx::tma_load_5d_hint(k_dst + p * kTileBytes / 2, &k_map, full, policy, p * 64, static_cast<int>(row0), 0, 0, 0);
            ptx::tma_load_5d_hint(v_dst + p * kTileBytes / 2, &v_map, full, policy, p * 64, static_cast<int>(row0), 0, 0, 0);
          } else {
            ptx::tma_load_5d(k_dst + p * kTileBytes / 2, &k_map, full, p * 64, static_cast<int>(row0), 0, 0, 0);
            ptx::tma_load_5d(v_dst + p * kTileBytes / 2, &v_map, full, p * 64, static_cast<int>(row0), 0, 0, 0);
          }
        }
      } else {
        const uint8_t* k_src = k + row0 * 256;
        const uint8_t* v_src = v + row0 * 256;
#pragma unroll 8
        for (int i = 0; i < kTileBytes / 16 / kProducers; ++i) {
          const int chunk = i * kProducers + static_cast<int>(threadIdx.x);
          cp_async_16(k_dst + chunk * 16, k_src + chunk * 16);
          cp_async_16(v_dst + chunk * 16, v_src + chunk * 16);
        }
        cp_async_arrive(full);
      }
    }
  } else if (warp == 4) {
    ring.consume_and_sum_last(base, kStageBytes, kTileBytes, mine, last_sums);

  }
}

// Reads n bytes (a clean flush: the L2 left holding them, none dirty).
__global__ void read_all(const uint4* p, long long n, unsigned* sink) {
  uint32_t x = 0;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n / 16; i += 256LL * gridDim.x) x ^= p[i].x;
  if (x == 0x12345678u) *sink = x;
}

int main(int argc, char** argv) {
  const bool clean = argc > 1 && std::string(argv[1]) == "clean";
  const long long elems = 1LL * kMaxTiles * kTileBytes / 2;  // 134 MB a tensor
  uint16_t *k, *v;
  uint8_t *flush, *copy_to, *reread;
  unsigned* sink;
  unsigned long long* sums;
  cudaMalloc(&k, elems * 2), cudaMalloc(&v, elems * 2), cudaMalloc(&flush, 256 << 20), cudaMalloc(&copy_to, elems * 2);
  cudaMalloc(&sums, 2 * 4096 * sizeof(unsigned long long));
  cudaMalloc(&reread, 256 << 20), cudaMalloc(&sink, 4), cudaMemset(reread, 0, 256 << 20);
  fill<<<1024, 256>>>(k, v, elems);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("FAIL: fill: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  const double copy = copy_rate(copy_to, k, elems * 2);
  std::printf("copy rate %.0f GB/s (read + written); tiles of 128 keys x 256 bytes, K and V, %d stages\n", copy / 1e9,
              kStages);
  const cuuint64_t dims[2] = {128, static_cast<cuuint64_t>(kMaxTiles) * 128}, strides[1] = {256};
  const cuuint32_t box[2] = {64, 128};
  const CUtensorMap k_map = tiled_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, k, 2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap v_map = tiled_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, v, 2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
  using Kernel = void (*)(CUtensorMap, CUtensorMap, const uint8_t*, const uint8_t*, int, unsigned long long*);
  struct Mode {
    Kernel kernel;
    bool tma, interleaved;
    const char* name;
  };
  const Mode modes[] = {{stream<true, false>, true, false, "TMA, contiguous"},
                        {stream<true, true>, true, true, "TMA, interleaved"},
                        {stream<false, false>, false, false, "cp.async, contiguous"},
                        {stream<false, true>, false, true, "cp.async, interleaved"},
                        {stream<true, false, true>, true, false, "TMA evict-first, contig."},
                        {stream<true, true, true>, true, true, "TMA evict-first, interl."}};
  bool ok = true;
  for (int pass = 0; pass < 2; ++pass)
    for (int tiles : {2048, 4096})
      for (int grid : {128, 132, 512, 2048})
        for (const Mode& m : modes) {
          if (grid == 132 && !m.interleaved) continue;
          if (grid > 132 && (!clean || m.interleaved || &m - modes > 3)) continue;
          if (clean && &m - modes > 3) continue;  // (evict-first: the dirty lines' case)
          cudaFuncSetAttribute(m.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
          const float best = best_of_runs(
              6,
              [&] {
                cudaMemset(flush, pass, 256 << 20), cudaMemset(sums, 0xA5, 2 * 4096 * 8);
                if (clean) read_all<<<1024, 256>>>(reinterpret_cast<const uint4*>(reread), 256 << 20, sink);
              },
              [&] { m.kernel<<<grid, 256, kSmem>>>(k_map, v_map, reinterpret_cast<const uint8_t*>(k),
                                                  reinterpret_cast<const uint8_t*>(v), tiles, sums); });
          const cudaError_t err = cudaGetLastError();
          if (err != cudaSuccess) {
            std::printf("FAIL: %s: %s\n", m.name, cudaGetErrorString(err));
            return 1;
          }
          std::vector<unsigned long long> got(2 * grid);
          cudaMemcpy(got.data(), sums, got.size() * 8, cudaMemcpyDeviceToHost);
          int wrong = 0;
          for (int c = 0; c < grid; ++c) {
            const long long row0 = 128LL * tile_of(m.interleaved, c, grid, tiles, tiles_of(m.interleaved, c, grid, tiles) - 1);
            for (int w = 0; w < 2; ++w) {
              unsigned long long sum = 0;
              for (long long i = row0 * 128; i < (row0 + 128) * 128; ++i) sum += value(w, i);
              wrong += got[2 * c + w] != sum;
            }
          }
          const double bytes = 1.0 * tiles * kStageBytes;
          std::printf("  %4.0f MB, %3d CTAs  %-24s %7.1f us  %5.0f GB/s (%.2f of the copy rate)  %s\n", bytes / 1e6, grid,
                      m.name, best * 1e3, bytes / (best * 1e-3) / 1e9, bytes / (best * 1e-3) / copy,
                      wrong == 0 ? "sums ok" : "SUMS WRONG");
          ok = ok && wrong == 0;
        }
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
