// What a paged key tile costs the producer (issue 16): pages of 16 keys took 1.7x the dense
// cache's time at B = 8 (run 141: 91.5 against 52.8 us), and loading the block-table entries
// ahead (paged-lookups, run 138) made it slower, not faster. Two suspects: the table look-ups
// (a dependent global load before each box) and the issue of 16 TMA boxes per tile from one
// thread (each UTMALDG's coordinates must reach uniform registers first). This streams the same
// bytes four ways, on every SM at once, with nothing but a waiting consumer warp:
//   dense      2 boxes of 128 rows per tile (one per 64-column panel), as a dense cache's;
//   paged      16 boxes of 16 rows from pages named by a random block table, each entry loaded
//              right before its box, from one thread (the KV-cache producer today);
//   preloaded  the same 16 boxes with the tile's 8 entries loaded by 8 lanes before the slot
//              wait and taken from them by shuffles: the table's latency off the path, the
//              issue still one thread's;
//   4 warps    the same boxes spread over the producer warpgroup's 4 warps (2 pages each): the
//              issue from four threads of different warps.
//   heads together  a dense KV cache's layout, (keys, 8 heads, 128 columns): a head's key rows
//              are 256 bytes every 2 KB; CTAs 8s .. 8s + 7 take the 8 heads of one sequence at
//              once, as tile_order's head-fastest order has them run (each 2 KB row read whole);
//   heads apart    the same layout with each CTA alone on its sequence (one head of it): 256
//              bytes used of every 2 KB row read at a time (run 143: the kernel's 3.8 TB/s at B =
//              64 against cuDNN's 4.3; does the layout cost that, or the order?).
// Each CTA streams its tiles through a 4-stage ring of 32 KB tiles (128 rows x 128 bf16
// columns), like K's ring in the d = 128 KV-cache kernel. Reported: us per tile per CTA and the
// bytes' rate against the copy rate the same run measures; and, as a check that every box
// landed where it should, the first element of each box of every CTA's last tile against the
// host's (FAIL on any difference). If `paged` is near `preloaded`, the table is not the cost;
// if `4 warps` is near `dense`, the issue is, and the producer's boxes should spread over warps.
// Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_tma \
//     tools/probes/p_tma_issue_rate.cu -lcuda && timeout 60 /tmp/p_tma
#include <cuda.h>
#include <cuda_bf16.h>
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

constexpr int kRows = 128, kCols = 128, kPage = 16, kBoxes = kRows / kPage, kStages = 4;
constexpr int kPanelBytes = kRows * 128;        // 64 bf16 columns x 128 rows
constexpr int kTileBytes = kRows * kCols * 2;   // 32 KB
constexpr int kSmem = 1024 + kStages * kTileBytes + 256;
enum Mode { kDense = 0, kPaged = 1, kPreloaded = 2, kFourWarps = 3, kHeadsTogether = 4, kHeadsApart = 5 };
constexpr int kHeads = 8;  // the strided modes' cache: (keys, kHeads, kCols)

// The strided modes' first key row of CTA c's tile t (in keys of its sequence's span) and head.
__host__ __device__ inline long long strided_key(int mode, int c, int t, int tiles, long long keys) {
  const long long span = static_cast<long long>(tiles) * kRows;  // a sequence: the CTA's keys
  const long long seq = mode == kHeadsTogether ? c / kHeads : c;
  return (seq * span + static_cast<long long>(t) * kRows) % keys;
}


// Box j of tile t: page table[t * kBoxes + j], its 16 rows into rows [16 j, 16 j + 16) of both panels.
__device__ __forceinline__ void page_box(uint32_t tile, const CUtensorMap* map, uint32_t bar, int j, int page) {
#pragma unroll
  for (int p = 0; p < 2; ++p) ptx::tma_load_5d(tile + p * kPanelBytes + j * kPage * 128, map, bar, 64 * p, page * kPage, 0, 0, 0);
}

template <int kMode>
__global__ void __launch_bounds__(256, 1) stream_tiles(const __grid_constant__ CUtensorMap dense_map,
                                                       const __grid_constant__ CUtensorMap page_map,
                                                       const int* __restrict__ table, int tiles, int dense_rows,
                                                       float* __restrict__ firsts) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base;
  // (4 warps: each arrives with its own boxes' bytes, so no box completes before its bytes are
  // expected and the phase waits for all four)
  ProbeRing<kStages>& ring = ProbeRing<kStages>::make(smem_raw, base, kTileBytes, kMode == kFourWarps ? 4 : 1);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int* my_table = table + static_cast<size_t>(blockIdx.x) * tiles * kBoxes;
  if (warp < 4) {  // the producer warpgroup
    for (int t = 0; t < tiles; ++t) {
      const int stage = t % kStages, phase = (t / kStages) & 1;
      const uint32_t tile = ptx::smem_addr(base + stage * kTileBytes), full = ptx::smem_addr(&ring.full[stage]);
      if constexpr (kMode == kFourWarps) {
        if (lane == 0) {
          const int p0 = my_table[t * kBoxes + 2 * warp], p1 = my_table[t * kBoxes + 2 * warp + 1];
          ptx::mbarrier_wait(ptx::smem_addr(&ring.empty[stage]), phase ^ 1);
          ptx::mbarrier_arrive_expect_tx(full, kTileBytes / 4);
          page_box(tile, &page_map, full, 2 * warp, p0);
          page_box(tile, &page_map, full, 2 * warp + 1, p1);
        }
      } else if (kMode == kHeadsTogether || kMode == kHeadsApart) {
        if (warp == 0 && lane == 0) {
          ptx::mbarrier_wait(ptx::smem_addr(&ring.empty[stage]), phase ^ 1);
          ptx::mbarrier_arrive_expect_tx(full, kTileBytes);
          const int key0 = static_cast<int>(strided_key(kMode, blockIdx.x, t, tiles, dense_rows / kHeads));
          const int head = blockIdx.x % kHeads;
#pragma unroll
          for (int p = 0; p < 2; ++p)
            ptx::tma_load_5d(tile + p * kPanelBytes, &page_map, full, head * kCols + 64 * p, key0, 0, 0, 0);
        }
      } else if (warp == 0) {
        int entry = 0;
        if constexpr (kMode == kPreloaded) entry = lane < kBoxes ? my_table[t * kBoxes + lane] : 0;
        int pages[kBoxes];
        if constexpr (kMode == kPreloaded) {
#pragma unroll
          for (int j = 0; j < kBoxes; ++j) pages[j] = __shfl_sync(0xffffffffu, entry, j);
        }
        if (lane == 0) {
          ptx::mbarrier_wait(ptx::smem_addr(&ring.empty[stage]), phase ^ 1);
          ptx::mbarrier_arrive_expect_tx(full, kTileBytes);
          if constexpr (kMode == kDense) {
            const int row0 = static_cast<int>((static_cast<long long>(blockIdx.x) * tiles + t) * kRows % dense_rows);
#pragma unroll
            for (int p = 0; p < 2; ++p) ptx::tma_load_5d(tile + p * kPanelBytes, &dense_map, full, 64 * p, row0, 0, 0, 0);
          } else {
#pragma unroll
            for (int j = 0; j < kBoxes; ++j)
              page_box(tile, &page_map, full, j, kMode == kPreloaded ? pages[j] : my_table[t * kBoxes + j]);
          }
        }
      }
    }
  } else if (warp == 4) {  // the consumer: waits for each tile, reads each box's first element, frees the slot
    for (int t = 0; t < tiles; ++t) {
      const int stage = t % kStages, phase = (t / kStages) & 1;
      ptx::mbarrier_wait(ptx::smem_addr(&ring.full[stage]), phase);
      if (t == tiles - 1 && lane < kBoxes) {  // row 16 lane of panel 0 (a multiple of 8 rows: chunk 0 unswizzled)
        const __nv_bfloat16 x = *reinterpret_cast<const __nv_bfloat16*>(base + stage * kTileBytes + lane * kPage * 128);
        firsts[blockIdx.x * kBoxes + lane] = __bfloat162float(x);
      }
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(ptx::smem_addr(&ring.empty[stage]));
    }
  }
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int tiles = 512;
  // 1 GiB of rows (128 bf16 columns each): out of L2, as a long cache is.
  const long long total_rows = (1LL << 30) / (kCols * 2);
  const int pages = static_cast<int>(total_rows / kPage);
  std::mt19937 rng(7);
  std::vector<__nv_bfloat16> host(static_cast<size_t>(total_rows) * kCols);
  for (size_t i = 0; i < host.size(); i += 1)
    host[i] = __float2bfloat16(static_cast<float>(static_cast<int>((i / kCols) % 256)));  // a row's number mod 256: exact in bf16 (8 bits)
  std::vector<int> table(static_cast<size_t>(sms) * tiles * kBoxes);
  std::uniform_int_distribution<int> page_of(0, pages - 1);
  for (int& e : table) e = page_of(rng);
  void* data = nullptr;
  int* table_dev = nullptr;
  float* firsts = nullptr;
  cudaMalloc(&data, host.size() * 2);
  cudaMalloc(&table_dev, table.size() * 4);
  cudaMalloc(&firsts, sms * kBoxes * 4);
  cudaMemcpy(data, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(table_dev, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
  const CUtensorMap dense_map = bf16_panel_map(data, kCols, static_cast<int>(total_rows), kRows);
  const CUtensorMap page_map = bf16_panel_map(data, kCols, static_cast<int>(total_rows), kPage);

  // The copy rate of the same run (bytes read + written per second).
  void* copy_to = nullptr;
  cudaMalloc(&copy_to, host.size() * 2);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaMemcpy(copy_to, data, host.size() * 2, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < 5; ++i) cudaMemcpy(copy_to, data, host.size() * 2, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float copy_ms = 0;
  cudaEventElapsedTime(&copy_ms, e0, e1);
  const double copy_rate = 5.0 * 2 * host.size() * 2 / (copy_ms * 1e-3);
  std::printf("copy rate %.0f GB/s (read + written); %d CTAs x %d tiles of %d KB\n", copy_rate / 1e9, sms, tiles,
              kTileBytes / 1024);

  // The strided modes (and a dense run of the same length beside them): 31 tiles a CTA, so that
  // the 132 CTAs' sequences of 31 x 128 keys fit the 1 GiB apart (524288 keys of 2 KB), none read
  // by two CTAs at once (that would be L2 hits, not DRAM reads).
  const CUtensorMap wide_map = bf16_panel_map(data, kHeads * kCols, static_cast<int>(total_rows / kHeads), kRows);
  struct Run {
    int mode, tiles;
    const char* name;
  };
  const Run runs[] = {{kDense, tiles, "dense (2 boxes of 128 rows)"},
                      {kPaged, tiles, "paged (16 boxes, entry loaded before each)"},
                      {kPreloaded, tiles, "preloaded (16 boxes, 8 entries by 8 lanes first)"},
                      {kFourWarps, tiles, "4 warps (16 boxes, 4 per warp)"},
                      {kDense, 31, "dense, 31 tiles a CTA"},
                      {kHeadsTogether, 31, "KV cache layout, a sequence's 8 heads together"},
                      {kHeadsApart, 31, "KV cache layout, one head a sequence at a time"}};
  void (*kernels[6])(CUtensorMap, CUtensorMap, const int*, int, int, float*) = {
      stream_tiles<kDense>,     stream_tiles<kPaged>,          stream_tiles<kPreloaded>,
      stream_tiles<kFourWarps>, stream_tiles<kHeadsTogether>, stream_tiles<kHeadsApart>};
  bool ok = true;
  for (const Run& run : runs) {
    const int m = run.mode, run_tiles = run.tiles;
    const bool strided = m == kHeadsTogether || m == kHeadsApart;
    cudaFuncSetAttribute(kernels[m], cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    const float best = best_of_runs(4, [&] { cudaMemset(firsts, 0xFF, sms * kBoxes * 4); }, [&] {
      kernels[m]<<<sms, 256, kSmem>>>(dense_map, strided ? wide_map : page_map, table_dev, run_tiles,
                                      static_cast<int>(total_rows), firsts);
    });
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      std::printf("FAIL: %s: %s\n", run.name, cudaGetErrorString(err));
      return 1;
    }
    // The last tile's boxes: their first rows' values, against the rows they came from (a strided
    // row's value: (key x 8 + head) mod 256, its element's 128-column row in the host's pattern).
    std::vector<float> got(sms * kBoxes);
    cudaMemcpy(got.data(), firsts, got.size() * 4, cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (int c = 0; c < sms; ++c)
      for (int j = 0; j < kBoxes; ++j) {
        const int t = run_tiles - 1;
        long long row;
        if (m == kDense)
          row = ((static_cast<long long>(c) * run_tiles + t) * kRows % total_rows) + j * kPage;
        else if (strided)
          row = (strided_key(m, c, t, run_tiles, total_rows / kHeads) + j * kPage) * kHeads + c % kHeads;
        else
          row = static_cast<long long>(table[(static_cast<size_t>(c) * tiles + t) * kBoxes + j]) * kPage;
        wrong += got[c * kBoxes + j] != static_cast<float>(row % 256);
      }
    const double bytes = static_cast<double>(sms) * run_tiles * kTileBytes;
    std::printf("  %-50s %8.3f ms  %6.2f us a tile per CTA  %6.0f GB/s (%.2f of the copy rate)  %s\n", run.name, best,
                best * 1e3 / run_tiles, bytes / (best * 1e-3) / 1e9, bytes / (best * 1e-3) / copy_rate,
                wrong == 0 ? "boxes ok" : "BOXES WRONG");
    ok = ok && wrong == 0;
  }
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
