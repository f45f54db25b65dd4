// Whether a decode step's stream is bound by the DRAM or by how it is loaded (issue 16): the
// bare TMA ring of p_kv_layout_rate.cu read the B = 8 4K step's 134 MB in 45-47 us (0.67-0.70
// of the copy rate) and tops out near 4.2 TB/s on long streams (run 199), where cuDNN's step at
// B = 64 moved ~4.3. This reads the same byte counts with plain 16-byte loads (LDG.128, four in
// flight a thread, grid-stride over every SM, `blocks_per_sm` CTAs of 512 threads a SM), no
// shared memory, no TMA: if a short stream of plain loads takes much less than the TMA ring's
// time, the fixed cost of a step is in the TMA ring's ramp, not the memory's.
// Reported per size: us (median of 9 runs, L2 flushed before each), TB/s read, and the ratio to
// the copy rate of the same run (read + written). Checked: the sum of all words against the
// host's (FAIL on a difference).
// Build and run from the repository root:
//   nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_read tools/probes/p_read_rate.cu \
//     -lcuda && timeout 60 /tmp/p_read
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_host.hpp"

__global__ void fill(uint4* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = make_uint4(uint32_t(i), uint32_t(i >> 7), 1u, uint32_t(i * 3));
}

// Every 16-byte word of [p, p + n) read once; each thread folds its words and adds its fold.
__global__ void __launch_bounds__(512) read_all(const uint4* __restrict__ p, size_t n, unsigned long long* sum) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    acc += a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w + c.x + c.y + c.z + c.w + d.x + d.y + d.z + d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(p + i);
    acc += a.x + a.y + a.z + a.w;
  }
  // One atomic a CTA (run 243's first version added every thread's fold to one address: 67K-270K
  // serialised atomics, tens of us, which swamped the reads).
  __shared__ uint32_t warp_sums[16];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t block = 0;
    for (int w = 0; w < 16; ++w) block += warp_sums[w];
    atomicAdd(sum, block);
  }
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t max_bytes = size_t(1) << 30;  // 1.07 GB: B = 64 4K's K and V at d = 128, Hkv = 8
  uint4 *buf = nullptr, *copy = nullptr, *flush = nullptr;
  unsigned long long* sum = nullptr;
  const size_t flush_bytes = size_t(256) << 20;
  if (cudaMalloc(&buf, max_bytes) || cudaMalloc(&copy, max_bytes) || cudaMalloc(&flush, flush_bytes) ||
      cudaMalloc(&sum, 8)) {
    std::printf("FAIL: cudaMalloc\n");
    return 1;
  }
  fill<<<sms * 8, 512>>>(buf, max_bytes / 16);
  const double copy_tbs = copy_rate(copy, buf, max_bytes) / 1e12;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  float ms = 0;
  std::printf("%d SMs, copy rate %.2f TB/s (read + written)\n", sms, copy_tbs);
  bool ok = true;
  for (size_t bytes : {size_t(134217728), size_t(268435456), max_bytes}) {  // B = 8 4K, B = 1 64K, B = 64 4K
    const size_t n = bytes / 16;
    // The host's sum of the words, as the kernel folds them (uint32 wrap, then 64-bit adds of the folds).
    unsigned long long expect = 0;
    {
      uint32_t words = 0;
      for (size_t i = 0; i < n; ++i) words += uint32_t(i) + uint32_t(i >> 7) + 1u + uint32_t(i * 3);
      expect = words;  // only the low 32 bits are compared: the folds wrap per thread
    }
    for (int blocks_per_sm : {1, 2, 4}) {
      std::vector<float> t;
      unsigned long long got = 0;
      for (int run = 0; run < 9; ++run) {
        cudaMemset(flush, run, flush_bytes);
        cudaMemset(sum, 0, 8);
        cudaEventRecord(e0);
        read_all<<<sms * blocks_per_sm, 512>>>(buf, n, sum);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms * 1000.f);
        cudaMemcpy(&got, sum, 8, cudaMemcpyDeviceToHost);
      }
      std::sort(t.begin(), t.end());
      const double us = t[4], tbs = bytes / (us * 1e-6) / 1e12;
      const bool right = uint32_t(got) == uint32_t(expect);
      ok = ok && right;
      std::printf("%5zu MB, %d CTAs/SM: %8.1f us  %.2f TB/s  %.2f of the copy rate  %s\n", bytes >> 20, blocks_per_sm,
                  us, tbs, tbs / copy_tbs, right ? "sum ok" : "FAIL: sum");
    }
  }
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) std::printf("FAIL: %s\n", cudaGetErrorString(err));
  std::printf("%s\n", ok && err == cudaSuccess ? "PASS" : "FAIL");
  return ok && err == cudaSuccess ? 0 : 1;
}
