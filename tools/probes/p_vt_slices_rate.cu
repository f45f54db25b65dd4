// Why the E4M3 KV cache reads 0.68 of the copy rate where the BF16 cache reads 0.92 (issue 16,
// run 188: neither the consumers' work, nor their serial chain, nor 3 -> 6 stages changed it).
// The suspect: Vᵀ's loads. The cache keeps Vᵀ as (pairs, d, S) bytes and the kernel takes a
// 128-key tile in wgmma's no-swizzle K-major layout, 16-key slices one after the other, through
// make_vt_slices_tensor_map's {16 keys, d, slices} boxes: a box row is 16 bytes, so a 16 KB tile
// is 1024 rows of 16 bytes, where K's tile (and the BF16 cache's) is 128 rows of 128 bytes.
// This streams a decode step's bytes (K and Vᵀ tiles of 16 KB each, d = 128, 4096 keys a
// (sequence, KV head) pair, 512 pairs: B = 64 x 8 KV heads) through a 3-stage ring on every SM,
// with only a waiting consumer warp, four ways of loading Vᵀ:
//   panel    (pairs, d, S), one box {128 keys, d} with the 128B swizzle (forward_fp8's Vᵀ tile);
//   slices   (pairs, d, S), one box {16, d, 8 slices} (the E4M3 cache's today);
//   sliced   (pairs, S / 16, d, 16): each tile's 8 slices already contiguous in global memory
//            (16 KB), one box of {128 bytes, 128 rows} without swizzle (a straight copy);
//   bulk     the same layout, one cp.async.bulk of 16 KB.
// K is the same in every mode: (pairs, S, d) bytes, a box {128, 128 keys}, 128B swizzle. Also
// "K only" (no Vᵀ: what the bytes of K alone take) and "K only, 64-byte rows" (the same bytes
// as rows of 64, a box {64, 256 rows} with the 64B swizzle: FP8 d = 64's K and Q tiles). Reported: us, the bytes' rate against the
// copy rate of the same run; checked: every byte of each CTA's last Vᵀ tile against the host's
// layout (FAIL on any difference).
// Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_vt \
//     tools/probes/p_vt_slices_rate.cu -lcuda && timeout 60 /tmp/p_vt
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "probe_host.hpp"
#include "probe_ring.cuh"

namespace ptx = warpattn::ptx;

constexpr int kDim = 128, kKeys = 4096, kPairs = 512, kTileKeys = 128, kStages = 3;
constexpr int kTileBytes = kTileKeys * kDim;              // 16 KB, K's or Vᵀ's
constexpr int kTilesPerPair = kKeys / kTileKeys;          // 32
constexpr long long kCacheBytes = 1LL * kPairs * kKeys * kDim;  // 256 MB each for K and Vᵀ
constexpr int kSmem = 1024 + kStages * 2 * kTileBytes + 256;
enum Mode { kPanel = 0, kSlices = 1, kSliced = 2, kBulk = 3, kKOnly = 4, kK64Only = 5 };


template <int kMode>
__global__ void __launch_bounds__(256, 1) stream(const __grid_constant__ CUtensorMap k_map,
                                                 const __grid_constant__ CUtensorMap v_map,
                                                 const uint8_t* __restrict__ v_raw, int tiles,
                                                 uint8_t* __restrict__ last_v) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base;
  ProbeRing<kStages>& ring = ProbeRing<kStages>::make(smem_raw, base, 2 * kTileBytes, 1);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0 && lane == 0) {
    for (int t = 0; t < tiles; ++t) {
      const int stage = t % kStages, phase = (t / kStages) & 1;
      const long long tile = static_cast<long long>(blockIdx.x) * tiles + t;
      const int pair = static_cast<int>(tile / kTilesPerPair), block = static_cast<int>(tile % kTilesPerPair);
      const uint32_t k_dst = ptx::smem_addr(base + stage * 2 * kTileBytes), v_dst = k_dst + kTileBytes;
      const uint32_t full = ptx::smem_addr(&ring.full[stage]);
      ptx::mbarrier_wait(ptx::smem_addr(&ring.empty[stage]), phase ^ 1);
      constexpr bool kKAlone = kMode == kKOnly || kMode == kK64Only;
      ptx::mbarrier_arrive_expect_tx(full, kKAlone ? kTileBytes : 2 * kTileBytes);
      if constexpr (kMode == kK64Only)  // (v_map: the K bytes as rows of 64)
        ptx::tma_load_5d(k_dst, &v_map, full, 0, static_cast<int>(tile * 256), 0, 0, 0);
      else
        ptx::tma_load_5d(k_dst, &k_map, full, 0, block * kTileKeys, pair, 0, 0);
      if constexpr (kMode == kPanel) ptx::tma_load_5d(v_dst, &v_map, full, block * kTileKeys, 0, pair, 0, 0);
      if constexpr (kMode == kSlices) ptx::tma_load_5d(v_dst, &v_map, full, 0, 0, block * 8, pair, 0);
      if constexpr (kMode == kSliced) ptx::tma_load_5d(v_dst, &v_map, full, 0, static_cast<int>(tile * 128), 0, 0, 0);
      if constexpr (kMode == kBulk) ptx::bulk_load(v_dst, v_raw + tile * kTileBytes, kTileBytes, full);
    }
  } else if (warp == 4) {
    for (int t = 0; t < tiles; ++t) {
      const int stage = t % kStages, phase = (t / kStages) & 1;
      ptx::mbarrier_wait(ptx::smem_addr(&ring.full[stage]), phase);
      if (t == tiles - 1) {
        const uint4* src = reinterpret_cast<const uint4*>(base + stage * 2 * kTileBytes + kTileBytes);
        uint4* dst = reinterpret_cast<uint4*>(last_v + static_cast<size_t>(blockIdx.x) * kTileBytes);
        for (int i = lane; i < kTileBytes / 16; i += 32) dst[i] = src[i];
      }
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(ptx::smem_addr(&ring.empty[stage]));
    }
  }
}

static CUtensorMap encode(void* data, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                          const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  return tiled_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, data, rank, dims, strides, box, swizzle);
}

// Byte i of the 16 KB tile the consumer copied out, as the mode lays it in shared memory, from
// the host's Vᵀ (pairs, d, S) bytes (the sliced modes' global buffer holds the same bytes
// rearranged, so the expected shared-memory tile is the same slices layout).
static uint8_t expected(int mode, const std::vector<uint8_t>& vt, long long tile, int i) {
  const int pair = static_cast<int>(tile / kTilesPerPair), block = static_cast<int>(tile % kTilesPerPair);
  int row, key;
  if (mode == kPanel) {  // row r: 128 bytes, 16-byte chunk c stored at chunk c ^ (r % 8)
    row = i / 128;
    const int chunk = ((i % 128) / 16) ^ (row % 8);
    key = chunk * 16 + i % 16;
  } else {  // slices: slice s, row r, 16 keys
    const int slice = i / (kDim * 16);
    row = (i / 16) % kDim;
    key = slice * 16 + i % 16;
  }
  return vt[(static_cast<size_t>(pair) * kDim + row) * kKeys + block * kTileKeys + key];
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int tiles = kPairs * kTilesPerPair / sms;  // 124 a CTA on 132 SMs
  std::mt19937 rng(11);
  std::vector<uint8_t> vt(kCacheBytes), sliced(kCacheBytes);
  for (auto& b : vt) b = static_cast<uint8_t>(rng());
  for (int p = 0; p < kPairs; ++p)  // (pairs, S / 16, d, 16) from (pairs, d, S)
    for (int r = 0; r < kDim; ++r)
      for (int k = 0; k < kKeys; ++k)
        sliced[((static_cast<size_t>(p) * (kKeys / 16) + k / 16) * kDim + r) * 16 + k % 16] =
            vt[(static_cast<size_t>(p) * kDim + r) * kKeys + k];
  uint8_t *k_dev, *vt_dev, *sliced_dev, *last;
  cudaMalloc(&k_dev, kCacheBytes), cudaMalloc(&vt_dev, kCacheBytes), cudaMalloc(&sliced_dev, kCacheBytes);
  cudaMalloc(&last, static_cast<size_t>(sms) * kTileBytes);
  cudaMemset(k_dev, 1, kCacheBytes);
  cudaMemcpy(vt_dev, vt.data(), kCacheBytes, cudaMemcpyHostToDevice);
  cudaMemcpy(sliced_dev, sliced.data(), kCacheBytes, cudaMemcpyHostToDevice);

  const cuuint64_t k_dims[3] = {kDim, kKeys, kPairs}, k_strides[2] = {kDim, 1ULL * kDim * kKeys};
  const cuuint32_t k_box[3] = {128, kTileKeys, 1};
  const CUtensorMap k_map = encode(k_dev, 3, k_dims, k_strides, k_box, CU_TENSOR_MAP_SWIZZLE_128B);
  const cuuint64_t p_dims[3] = {kKeys, kDim, kPairs}, p_strides[2] = {kKeys, 1ULL * kDim * kKeys};
  const cuuint32_t p_box[3] = {kTileKeys, kDim, 1};
  const CUtensorMap panel_map = encode(vt_dev, 3, p_dims, p_strides, p_box, CU_TENSOR_MAP_SWIZZLE_128B);
  const cuuint64_t s_dims[4] = {16, kDim, kKeys / 16, kPairs}, s_strides[3] = {kKeys, 16, 1ULL * kDim * kKeys};
  const cuuint32_t s_box[4] = {16, kDim, kTileKeys / 16, 1};
  const CUtensorMap slices_map = encode(vt_dev, 4, s_dims, s_strides, s_box, CU_TENSOR_MAP_SWIZZLE_NONE);
  const cuuint64_t l_dims[2] = {128, static_cast<cuuint64_t>(kCacheBytes / 128)}, l_strides[1] = {128};
  const cuuint32_t l_box[2] = {128, 128};
  const CUtensorMap sliced_map = encode(sliced_dev, 2, l_dims, l_strides, l_box, CU_TENSOR_MAP_SWIZZLE_NONE);
  const cuuint64_t r_dims[2] = {64, static_cast<cuuint64_t>(kCacheBytes / 64)}, r_strides[1] = {64};
  const cuuint32_t r_box[2] = {64, 256};
  const CUtensorMap k64_map = encode(k_dev, 2, r_dims, r_strides, r_box, CU_TENSOR_MAP_SWIZZLE_64B);

  // The copy rate of the same run (bytes read + written per second).
  uint8_t* copy_to = nullptr;
  cudaMalloc(&copy_to, kCacheBytes);
  const double copy = copy_rate(copy_to, vt_dev, kCacheBytes);
  std::printf("copy rate %.0f GB/s (read + written); %d CTAs x %d tiles (K + Vt, 16 KB each), %d stages\n",
              copy / 1e9, sms, tiles, kStages);

  struct Run {
    int mode;
    const char* name;
    const CUtensorMap* v_map;
  };
  const Run runs[] = {{kKOnly, "K only", &panel_map},
                      {kK64Only, "K only, 64-byte rows (box 64 B x 256, 64B swizzle)", &k64_map},
                      {kPanel, "K + Vt panel (box 128 keys x d, 128B swizzle)", &panel_map},
                      {kSlices, "K + Vt slices (box 16 x d x 8, 16-byte rows)", &slices_map},
                      {kSliced, "K + Vt sliced in global (box 128 B x 128)", &sliced_map},
                      {kBulk, "K + Vt sliced in global (one bulk copy)", &sliced_map},
                      {kSlices, "K + Vt slices again", &slices_map},
                      {kPanel, "K + Vt panel again", &panel_map}};
  void (*kernels[6])(CUtensorMap, CUtensorMap, const uint8_t*, int, uint8_t*) = {
      stream<kPanel>, stream<kSlices>, stream<kSliced>, stream<kBulk>, stream<kKOnly>, stream<kK64Only>};
  bool ok = true;
  for (const Run& run : runs) {
    const int m = run.mode;
    cudaFuncSetAttribute(kernels[m], cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    const float best = best_of_runs(
        5, [&] { cudaMemset(last, 0xA5, static_cast<size_t>(sms) * kTileBytes); },
        [&] { kernels[m]<<<sms, 256, kSmem>>>(k_map, *run.v_map, sliced_dev, tiles, last); });
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      std::printf("FAIL: %s: %s\n", run.name, cudaGetErrorString(err));
      return 1;
    }
    int wrong = 0;
    if (m != kKOnly && m != kK64Only) {
      std::vector<uint8_t> got(static_cast<size_t>(sms) * kTileBytes);
      cudaMemcpy(got.data(), last, got.size(), cudaMemcpyDeviceToHost);
      for (int c = 0; c < sms; ++c)
        for (int i = 0; i < kTileBytes; ++i)
          wrong += got[static_cast<size_t>(c) * kTileBytes + i] !=
                   expected(m, vt, static_cast<long long>(c) * tiles + tiles - 1, i);
    }
    const double bytes = static_cast<double>(sms) * tiles * kTileBytes * (m == kKOnly || m == kK64Only ? 1 : 2);
    std::printf("  %-48s %8.1f us  %6.0f GB/s (%.2f of the copy rate)  %s\n", run.name, best * 1e3,
                bytes / (best * 1e-3) / 1e9, bytes / (best * 1e-3) / copy,
                m == kKOnly || m == kK64Only ? "" : (wrong == 0 ? "tiles ok" : "TILES WRONG"));
    ok = ok && wrong == 0;
  }
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
