// Step 2 of the FP8 KV cache (docs/decode-fp8-cache-design.md): can a 128-key Vᵀ tile be built
// from the pages of 16 keys that hold it, and read by the FP8 P·V GEMM? Vᵀ pages are (pages, d,
// 16) E4M3, each page's keys in forward_fp8's key order (fp8_cache_layout.hpp). One TMA box of
// 16 keys x d rows per 16 keys of the tile (no swizzle) lands as d / 8 core matrices of 8 rows x
// 16 bytes, one after another: wgmma's no-swizzle K-major layout, 16 keys of K per box, the
// stride between 8-row groups along N (SBO) 128 bytes, between the 16-key boxes along K (LBO)
// d x 16 bytes, each k32 step two boxes further. One warpgroup then multiplies a P of 64 rows x
// 128 keys (registers, packed as the forward packs P, kFp8KeyOrder included) by that tile with
// m64n64k32 e4m3 wgmma (d = 64), and the result is compared with the host's P·V: values chosen
// exactly representable so that the sums are exact (PASS: every element equal). The same GEMM
// with LBO and SBO swapped is run too, and must not match (it shows the check can fail).
// Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_vt \
//     tools/probes/p_fp8_vt_pages.cu -lcuda && timeout 60 /tmp/p_vt
#include <cuda.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/host_fp8.hpp"
#include "hopper/consumer_gemms.cuh"
#include "hopper/decode/fp8_cache_layout.hpp"
#include "hopper/fragment.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/ptx/wgmma_ops.cuh"

using namespace warpattn;
using namespace warpattn::detail;

constexpr int kD = 64, kKeys = 128, kPage = 16, kPages = 40, kRows = 64;
constexpr int kBoxBytes = kD * kPage;          // 1 KB: d rows of 16 keys
constexpr int kTileBytes = kD * kKeys;         // 8 KB
struct ProbeCfg {  // what convert_to_operand reads of a config
  static constexpr bool kFp8 = true;
  static constexpr int kBlockN = kKeys, kPvSteps = kKeys / 32;
};

// A no-swizzle (layout 0) shared-memory descriptor: lbo the stride between core matrices along
// K, sbo between 8-row groups along M/N (bytes).
__device__ __forceinline__ uint64_t plain_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32);
}

__global__ void __launch_bounds__(128) vt_pages_pv(const __grid_constant__ CUtensorMap vt_map, const int* table,
                                                   const float* p_host, float* out, int swap) {
  // Twice the tile: the swapped descriptor's reads reach 13.25 KB past its start (run 145: with
  // 8 KB they left the CTA's shared memory, an illegal address), and must stay inside.
  __shared__ __align__(1024) uint8_t tile[2 * kTileBytes];
  __shared__ uint64_t full;
  const int t = threadIdx.x;
  if (t == 0) {
    ptx::mbarrier_init(ptx::smem_addr(&full), 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (t == 0) {
    const uint32_t bar = ptx::smem_addr(&full);
    ptx::mbarrier_arrive_expect_tx(bar, kTileBytes);
    for (int j = 0; j < kKeys / kPage; ++j)  // box j: keys 16 j .. 16 j + 15, from page table[j]
      ptx::tma_load_5d(ptx::smem_addr(tile) + j * kBoxBytes, &vt_map, bar, 0, 0, table[j], 0, 0);
  }
  // P as the S accumulator would hold it (row f.row(r), key f.col(j, c) at s[4 j + 2 r + c]).
  const FragmentCoords f(t);
  float s[kKeys / 2];
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) s[4 * j + 2 * r + c] = p_host[f.row(r) * kKeys + f.col(j, c)];
  uint32_t p[ProbeCfg::kPvSteps][4];
  convert_to_operand<ProbeCfg>(s, p);
  ptx::mbarrier_wait(ptx::smem_addr(&full), 0);
  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  const uint32_t lbo = swap ? 128 : kBoxBytes, sbo = swap ? kBoxBytes : 128;
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < ProbeCfg::kPvSteps; ++kk)  // k32: two 16-key boxes a step
    ptx::WgmmaRS<__nv_fp8_e4m3, kD>::mma(o, p[kk], plain_desc(ptx::smem_addr(tile) + kk * 2 * kBoxBytes, lbo, sbo),
                                         kk > 0);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::pin(o);
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) out[f.row(r) * kD + f.col(j, c)] = o[4 * j + 2 * r + c];
}

int main() {
  std::mt19937 rng(11);
  // V (128 keys x d) and P (64 x 128): small multiples of powers of two, exact in E4M3, so that
  // every product and sum is exact in fp32.
  std::uniform_int_distribution<int> small(-4, 4), pick(0, 3);
  std::vector<float> v(kKeys * kD), pm(kRows * kKeys);
  for (float& x : v) x = small(rng) * 0.25f;
  for (float& x : pm) x = static_cast<float>(pick(rng)) * 0.125f;
  // Eight distinct pages of the 40 hold the tile's keys; the others are garbage.
  std::vector<int> pages(kPages);
  for (int i = 0; i < kPages; ++i) pages[i] = i;
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<int> table(pages.begin(), pages.begin() + kKeys / kPage);
  const Fp8CacheShape shape{kPages, kPage, 1, kD};
  std::vector<uint8_t> vt(kPages * kPage * kD, 0x7E);  // 448: any stray read shows
  for (int key = 0; key < kKeys; ++key)
    for (int col = 0; col < kD; ++col)
      vt[fp8_cache_vt_offset(shape, table[key / kPage], key % kPage, 0, col)] = host::float_to_e4m3(v[key * kD + col]);
  std::vector<double> want(kRows * kD, 0.0);
  for (int r = 0; r < kRows; ++r)
    for (int col = 0; col < kD; ++col)
      for (int key = 0; key < kKeys; ++key) want[r * kD + col] += double(pm[r * kKeys + key]) * v[key * kD + col];

  uint8_t* vt_dev = nullptr;
  int* table_dev = nullptr;
  float *p_dev = nullptr, *out_dev = nullptr;
  cudaMalloc(&vt_dev, vt.size());
  cudaMalloc(&table_dev, table.size() * 4);
  cudaMalloc(&p_dev, pm.size() * 4);
  cudaMalloc(&out_dev, want.size() * 4);
  cudaMemcpy(vt_dev, vt.data(), vt.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(table_dev, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(p_dev, pm.data(), pm.size() * 4, cudaMemcpyHostToDevice);
  // The Vᵀ pages as {16 keys, d rows, pages, 1, 1} bytes; boxes of one page, no swizzle.
  CUtensorMap map;
  const cuuint64_t dims[5] = {kPage, kD, kPages, 1, 1};
  const cuuint64_t strides[4] = {kPage, static_cast<cuuint64_t>(kPage) * kD, static_cast<cuuint64_t>(kPage) * kD * kPages,
                                 static_cast<cuuint64_t>(kPage) * kD * kPages};
  const cuuint32_t box[5] = {kPage, kD, 1, 1, 1}, elements[5] = {1, 1, 1, 1, 1};
  if (cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 5, vt_dev, dims, strides, box, elements,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("FAIL: cuTensorMapEncodeTiled\n");
    return 1;
  }
  int differ[2] = {0, 0};
  for (int swap = 0; swap < 2; ++swap) {
    cudaMemset(out_dev, 0xFF, want.size() * 4);
    vt_pages_pv<<<1, 128>>>(map, table_dev, p_dev, out_dev, swap);
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      std::printf("FAIL (%s descriptor): %s\n", swap ? "swapped" : "the layout's", cudaGetErrorString(e));
      return 1;
    }
    std::vector<float> got(want.size());
    cudaMemcpy(got.data(), out_dev, got.size() * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < got.size(); ++i) differ[swap] += got[i] != static_cast<float>(want[i]);
  }
  std::printf("no-swizzle Vᵀ from 8 pages of 16 keys: %d of %d outputs differ from the host's P·V; with LBO and SBO "
              "swapped: %d (must be > 0)\n",
              differ[0], kRows * kD, differ[1]);
  const bool ok = differ[0] == 0 && differ[1] > 0;
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
