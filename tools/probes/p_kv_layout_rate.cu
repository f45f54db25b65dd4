// Whether the KV cache's (B, S, Hkv, d) layout is what holds a 16-bit decode step at ~3.2-3.5
// TB/s where a long stream reaches ~3.9-4.1 (issue 16, run 194: the B = 8 4K step streamed at the
// same rate from 64 CTAs as from 128, so a CTA's own rate is not its bound). In that layout a
// (sequence, KV head) pair's keys are Hkv x d x 2 = 2 KB apart, rows of 256 bytes, and when the
// 8 heads' CTAs drift apart each DRAM page they open is read for a fraction of its bytes.
// This streams a decode step's bytes (BF16, d = 128, Hkv = 8, 4096 keys a sequence; K and V
// tiles of 32 KB, two 128B-swizzled panels of 64 columns each, as the kernel's) through a
// 3-stage ring, only a waiting consumer warp, four ways:
//   head        (B, S, Hkv, d), a CTA on one (sequence, KV head, split), boxes {64, 1 head, 128
//               keys}: the kernel's loads today;
//   contiguous  (B, Hkv, S, d), the same work items, boxes {64, 128 keys}: each tile 32 KB of
//               contiguous bytes;
//   all heads   (B, S, Hkv, d), a CTA on every KV head of one key range, boxes {64, 8 heads, 16
//               keys}: each tile the same 32 KB of contiguous bytes, read where they lie.
//   balanced    the head layout's tiles cut evenly over the CTAs in order, whatever their work
//               items: the grid without a last, partly full round (B = 64's 512 items on 132
//               CTAs take 4 rounds, the last 88% full), i.e. what a split tail could gain.
// Each at B = 8 with 1 and 2 splits (64 and 128 CTAs; the same tiles a CTA in every mode) and B
// = 64 (512 items on the persistent grid). Reported: us, the rate of bytes read against the
// copy rate of the same run (read + written); checked: each CTA's last K and V tile's sum of
// values against the host's (swizzle-invariant; FAIL on any difference). L2 flushed before each
// timed run.
// Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_kv \
//     tools/probes/p_kv_layout_rate.cu -lcuda && timeout 60 /tmp/p_kv
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "probe_host.hpp"
#include "probe_ring.cuh"

namespace ptx = warpattn::ptx;

constexpr int kDim = 128, kHeads = 8, kKeys = 4096, kStages = 3, kMaxBatch = 64;
constexpr int kPanelBytes = 128 * 128;            // 128 rows of 128 bytes (64 bf16 columns)
constexpr int kTileBytes = 2 * kPanelBytes;       // 32 KB: 128 keys x d, or 16 keys x 8 heads x d
constexpr int kStageBytes = 2 * kTileBytes;       // K and V
constexpr int kSmem = 1024 + kStages * kStageBytes + 256;
enum Mode { kHead = 0, kContiguous = 1, kAllHeads = 2, kBalanced = 3 };


// Element (b, s, h, c) of K (which = 0) or V (1): a hash of its logical index, whatever the layout.
__host__ __device__ inline uint16_t value(int which, int b, int s, int h, int c) {
  const uint32_t i = ((static_cast<uint32_t>(b) * kKeys + s) * kHeads + h) * kDim + c;
  return static_cast<uint16_t>(((i ^ (which ? 0x5bd1e995u : 0u)) * 2654435761u) >> 16);
}

__global__ void fill(uint16_t* k_bshd, uint16_t* v_bshd, uint16_t* k_bhsd, uint16_t* v_bhsd, int batch) {
  const long long n = 1LL * batch * kKeys * kHeads * kDim;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    const int c = static_cast<int>(i % kDim), h = static_cast<int>(i / kDim % kHeads);
    const int s = static_cast<int>(i / (kDim * kHeads) % kKeys), b = static_cast<int>(i / (1LL * kDim * kHeads * kKeys));
    const long long j = ((1LL * b * kHeads + h) * kKeys + s) * kDim + c;
    k_bshd[i] = value(0, b, s, h, c), v_bshd[i] = value(1, b, s, h, c);
    k_bhsd[j] = value(0, b, s, h, c), v_bhsd[j] = value(1, b, s, h, c);
  }
}

// Work item i: (sequence, KV head, split) for kHead and kContiguous, (sequence, key range) for
// kAllHeads; tiles: 128-key tiles of a split, or 16-key tiles of a range (the same count).
struct Item {
  int b, h, key0;
};
__host__ __device__ inline Item item_of(int mode, int i, int splits) {
  if (mode == kAllHeads) {
    const int ranges = kHeads * splits;
    return {i / ranges, 0, (i % ranges) * (kKeys / ranges)};
  }
  return {i / (kHeads * splits), i / splits % kHeads, i % splits * (kKeys / splits)};
}
__host__ __device__ inline int tiles_per_item(int splits) { return kKeys / splits / 128; }

template <int kMode>
__global__ void __launch_bounds__(256, 1) stream(const __grid_constant__ CUtensorMap k_map,
                                                 const __grid_constant__ CUtensorMap v_map, int items, int splits,
                                                 unsigned long long* __restrict__ last_sums) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base;
  ProbeRing<kStages>& ring = ProbeRing<kStages>::make(smem_raw, base, kStageBytes, 1);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_item = tiles_per_item(splits);
  const int my_items = (items - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  // kBalanced: an even share of the launch's tiles in order, whatever their items
  const long long total = 1LL * items * per_item;
  const int first = kMode == kBalanced ? static_cast<int>(blockIdx.x * total / gridDim.x) : 0;
  const int tiles = kMode == kBalanced ? static_cast<int>((blockIdx.x + 1) * total / gridDim.x) - first : my_items * per_item;
  if (warp == 0 && lane == 0) {
    for (int t = 0; t < tiles; ++t) {
      const int stage = t % kStages, phase = (t / kStages) & 1;
      const Item it = kMode == kBalanced
                          ? item_of(kHead, (first + t) / per_item, splits)
                          : item_of(kMode, static_cast<int>(blockIdx.x) + t / per_item * static_cast<int>(gridDim.x), splits);
      const int tile = kMode == kBalanced ? (first + t) % per_item : t % per_item;
      const uint32_t k_dst = ptx::smem_addr(base + stage * kStageBytes), v_dst = k_dst + kTileBytes;
      const uint32_t full = ptx::smem_addr(&ring.full[stage]);
      ptx::mbarrier_wait(ptx::smem_addr(&ring.empty[stage]), phase ^ 1);
      ptx::mbarrier_arrive_expect_tx(full, kStageBytes);
      for (int p = 0; p < 2; ++p) {
        if constexpr (kMode == kHead || kMode == kBalanced) {  // {d, Hkv, S, B}
          ptx::tma_load_5d(k_dst + p * kPanelBytes, &k_map, full, p * 64, it.h, it.key0 + tile * 128, it.b, 0);
          ptx::tma_load_5d(v_dst + p * kPanelBytes, &v_map, full, p * 64, it.h, it.key0 + tile * 128, it.b, 0);
        } else if constexpr (kMode == kContiguous) {  // {d, S, Hkv, B}
          ptx::tma_load_5d(k_dst + p * kPanelBytes, &k_map, full, p * 64, it.key0 + tile * 128, it.h, it.b, 0);
          ptx::tma_load_5d(v_dst + p * kPanelBytes, &v_map, full, p * 64, it.key0 + tile * 128, it.h, it.b, 0);
        } else {  // {d, Hkv, S, B}, 16 keys x 8 heads
          ptx::tma_load_5d(k_dst + p * kPanelBytes, &k_map, full, p * 64, 0, it.key0 + tile * 16, it.b, 0);
          ptx::tma_load_5d(v_dst + p * kPanelBytes, &v_map, full, p * 64, 0, it.key0 + tile * 16, it.b, 0);
        }
      }
    }
  } else if (warp == 4) {
    ring.consume_and_sum_last(base, kStageBytes, kTileBytes, tiles, last_sums);

  }
}

// A bf16 tensor of 4 dims (innermost first, in elements; strides of dims 1..3 in bytes) as a
// 5-D map with a box of 64 columns x box1 x box2 x 1, 128B swizzle.
static CUtensorMap encode(void* data, const cuuint64_t (&dims)[4], const cuuint64_t (&strides)[3], cuuint32_t box1,
                          cuuint32_t box2) {
  const cuuint32_t box[4] = {64, box1, box2, 1};
  return tiled_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, data, 4, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// The host's sum of a CTA's last K (which = 0) or V tile.
static unsigned long long expected_sum(int mode, int which, int cta, int grid, int items, int splits) {
  const int my_items = (items - cta + grid - 1) / grid;
  const int per_item = tiles_per_item(splits);
  const long long last = (cta + 1LL) * items * per_item / grid - 1;  // kBalanced's last tile
  const Item it = mode == kBalanced ? item_of(kHead, static_cast<int>(last / per_item), splits)
                                    : item_of(mode, cta + (my_items - 1) * grid, splits);
  const int tile = mode == kBalanced ? static_cast<int>(last % per_item) : per_item - 1;
  unsigned long long sum = 0;
  for (int c = 0; c < kDim; ++c) {
    if (mode == kAllHeads) {
      for (int k = 0; k < 16; ++k)
        for (int h = 0; h < kHeads; ++h) sum += value(which, it.b, it.key0 + tile * 16 + k, h, c);
    } else {
      for (int k = 0; k < 128; ++k) sum += value(which, it.b, it.key0 + tile * 128 + k, it.h, c);
    }
  }
  return sum;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t max_bytes = 2ULL * kMaxBatch * kKeys * kHeads * kDim;  // 512 MB a tensor
  uint16_t *k_bshd, *v_bshd, *k_bhsd, *v_bhsd;
  uint8_t *flush, *copy_to;
  unsigned long long* sums;
  cudaMalloc(&k_bshd, max_bytes), cudaMalloc(&v_bshd, max_bytes);
  cudaMalloc(&k_bhsd, max_bytes), cudaMalloc(&v_bhsd, max_bytes);
  cudaMalloc(&flush, 256 << 20), cudaMalloc(&copy_to, max_bytes);
  cudaMalloc(&sums, 2 * 1024 * sizeof(unsigned long long));
  fill<<<4 * sms, 256>>>(k_bshd, v_bshd, k_bhsd, v_bhsd, kMaxBatch);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("FAIL: fill: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }

  const double copy = copy_rate(copy_to, k_bshd, max_bytes);
  std::printf("copy rate %.0f GB/s (read + written); bf16 d = %d, %d KV heads, %d keys, %d stages of K + V (32 KB each)\n",
              copy / 1e9, kDim, kHeads, kKeys, kStages);

  const cuuint64_t row = kDim * 2;
  const cuuint64_t bshd_dims[4] = {kDim, kHeads, kKeys, kMaxBatch};
  const cuuint64_t bshd_strides[3] = {row, row * kHeads, row * kHeads * kKeys};
  const cuuint64_t bhsd_dims[4] = {kDim, kKeys, kHeads, kMaxBatch};
  const cuuint64_t bhsd_strides[3] = {row, row * kKeys, row * kKeys * kHeads};
  const CUtensorMap k_head = encode(k_bshd, bshd_dims, bshd_strides, 1, 128), v_head = encode(v_bshd, bshd_dims, bshd_strides, 1, 128);
  const CUtensorMap k_all = encode(k_bshd, bshd_dims, bshd_strides, kHeads, 16), v_all = encode(v_bshd, bshd_dims, bshd_strides, kHeads, 16);
  const CUtensorMap k_cont = encode(k_bhsd, bhsd_dims, bhsd_strides, 128, 1), v_cont = encode(v_bhsd, bhsd_dims, bhsd_strides, 128, 1);

  void (*kernels[4])(CUtensorMap, CUtensorMap, int, int, unsigned long long*) = {stream<kHead>, stream<kContiguous>,
                                                                                  stream<kAllHeads>, stream<kBalanced>};
  const char* names[4] = {"head (B,S,Hkv,d), box 1 head x 128 keys", "contiguous (B,Hkv,S,d), box 128 keys",
                          "all heads (B,S,Hkv,d), box 8 heads x 16 keys", "head, an even share of the tiles a CTA"};
  const CUtensorMap* maps[4][2] = {{&k_head, &v_head}, {&k_cont, &v_cont}, {&k_all, &v_all}, {&k_head, &v_head}};
  const int shapes[][2] = {{8, 1}, {8, 2}, {64, 1}};  // (B, splits)
  bool ok = true;
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& shape : shapes) {
      const int batch = shape[0], splits = shape[1], items = batch * kHeads * splits;
      const int grid = items < sms ? items : sms;
      for (int m = 0; m < 4; ++m) {
        cudaFuncSetAttribute(kernels[m], cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        const float best = best_of_runs(
            6,
            [&] {
              cudaMemset(flush, pass + m, 256 << 20);
              cudaMemset(sums, 0xA5, 2 * 1024 * sizeof(unsigned long long));
            },
            [&] { kernels[m]<<<grid, 256, kSmem>>>(*maps[m][0], *maps[m][1], items, splits, sums); });
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) {
          std::printf("FAIL: %s: %s\n", names[m], cudaGetErrorString(err));
          return 1;
        }
        std::vector<unsigned long long> got(2 * grid);
        cudaMemcpy(got.data(), sums, got.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
        int wrong = 0;
        for (int c = 0; c < grid; ++c)
          for (int w = 0; w < 2; ++w) wrong += got[2 * c + w] != expected_sum(m, w, c, grid, items, splits);
        const double bytes = 2.0 * batch * kKeys * kHeads * kDim * 2;
        std::printf("  B = %2d, %d split%s, %3d CTAs  %-46s %7.1f us  %5.0f GB/s (%.2f of the copy rate)  %s\n", batch,
                    splits, splits > 1 ? "s" : " ", grid, names[m], best * 1e3, bytes / (best * 1e-3) / 1e9,
                    bytes / (best * 1e-3) / copy, wrong == 0 ? "sums ok" : "SUMS WRONG");
        ok = ok && wrong == 0;
      }
    }
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
