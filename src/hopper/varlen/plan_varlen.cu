// The planning kernels of a packed batch (plan_varlen.hpp).
//
// plan_sequences_kernel (one CTA): each sequence's work and tile count; the sequences sorted by
// work, descending (up to kSortLimit sequences; beyond, kept in batch order); the prefix sums of
// their tiles in that order, and the table's length.
// fill_tiles_kernel (a thread per table entry): finds its sequence by binary search over the
// prefix sums and writes the tile (varlen_tile).
#include "hopper/cuda_check.hpp"
#include "hopper/varlen/plan_varlen.hpp"

namespace warpattn::detail {
namespace {

constexpr int kPlanThreads = 1024;
// Sequences sorted in shared memory (8 bytes each). A larger batch keeps its own order: with so
// many sequences the tail is short anyway.
constexpr int kSortLimit = 4096;

size_t round16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// The workspace: [tile_count][starts: batch + 1][order: batch][tiles: max_tiles].
struct PlanLayout {
  int* tile_count;
  int* starts;
  int* order;
  VarlenTile* tiles;
  PlanLayout(void* base, int batch) {
    char* p = static_cast<char*>(base);
    tile_count = reinterpret_cast<int*>(p);
    p += 16;
    starts = reinterpret_cast<int*>(p);
    p += round16(sizeof(int) * (batch + 1));
    order = reinterpret_cast<int*>(p);
    p += round16(sizeof(int) * batch);
    tiles = reinterpret_cast<VarlenTile*>(p);
  }
};

struct PlanArgs {
  VarlenSequences seqs;
  VarlenGeometry g;
  int max_tiles;
  int* tile_count;
  int* starts;
  int* order;
  VarlenTile* tiles;
};

// Exclusive prefix sum over the CTA's threads (kPlanThreads); returns this thread's start and
// sets *total.
__device__ long long exclusive_scan(long long x, long long* warp_sums, long long* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  long long inclusive = x;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const long long y = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += y;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    long long w = warp_sums[lane];  // kPlanThreads / 32 == 32 warps
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += y;
    }
    warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  *total = warp_sums[31];
  return inclusive - x + (warp > 0 ? warp_sums[warp - 1] : 0);
}

__global__ void __launch_bounds__(kPlanThreads) plan_sequences_kernel(const __grid_constant__ PlanArgs a) {
  __shared__ unsigned long long keys[kSortLimit];
  __shared__ long long warp_sums[32];
  const int batch = a.seqs.batch;
  const bool sorted = batch <= kSortLimit;
  if (sorted) {
    int n = 1;
    while (n < batch) n <<= 1;
    for (int i = threadIdx.x; i < n; i += kPlanThreads)
      keys[i] = i < batch ? plan_key(sequence_work(sequence_span(a.seqs, i), a.g), i) : ~0ull;
    __syncthreads();
    // Bitonic sort, ascending keys: work descending, then batch index ascending.
    for (int k = 2; k <= n; k <<= 1)
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int i = threadIdx.x; i < n; i += kPlanThreads) {
          const int partner = i ^ j;
          if (partner > i) {
            const bool ascending = (i & k) == 0;
            const unsigned long long x = keys[i], y = keys[partner];
            if ((x > y) == ascending) {
              keys[i] = y;
              keys[partner] = x;
            }
          }
        }
        __syncthreads();
      }
  }
  // Each thread: a run of consecutive positions of the order.
  const int per_thread = (batch + kPlanThreads - 1) / kPlanThreads;
  const int lo = min(batch, static_cast<int>(threadIdx.x) * per_thread), hi = min(batch, lo + per_thread);
  const auto sequence_at = [&](int i) { return sorted ? static_cast<int>(keys[i] & 0xffffffffu) : i; };
  long long mine = 0;
  for (int i = lo; i < hi; ++i) mine += sequence_tiles(sequence_span(a.seqs, sequence_at(i)), a.g);
  long long total = 0;
  long long run = exclusive_scan(mine, warp_sums, &total);
  for (int i = lo; i < hi; ++i) {
    const int b = sequence_at(i);
    a.order[i] = b;
    a.starts[i] = static_cast<int>(min(run, static_cast<long long>(a.max_tiles)));
    run += sequence_tiles(sequence_span(a.seqs, b), a.g);
  }
  if (threadIdx.x == 0) {
    const int count = static_cast<int>(min(total, static_cast<long long>(a.max_tiles)));
    a.starts[batch] = count;
    *a.tile_count = count;
  }
}

__global__ void __launch_bounds__(256) fill_tiles_kernel(const __grid_constant__ PlanArgs a) {
  const int t = static_cast<int>(blockIdx.x) * 256 + static_cast<int>(threadIdx.x);
  if (t >= *a.tile_count) return;
  // The last position whose start is <= t (sequences without tiles share their successor's).
  int lo = 0, hi = a.seqs.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.starts[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int b = a.order[lo];
  a.tiles[t] = varlen_tile(sequence_span(a.seqs, b), b, t - a.starts[lo], a.g);
}

}  // namespace

size_t varlen_plan_bytes(int batch, long long max_tiles) {
  return 16 + round16(sizeof(int) * (batch + 1)) + round16(sizeof(int) * batch) + sizeof(VarlenTile) * max_tiles;
}

VarlenPlan plan_varlen_tiles(const VarlenSequences& seqs, const VarlenGeometry& g, long long max_tiles,
                             void* workspace, cudaStream_t stream) {
  const PlanLayout layout(workspace, seqs.batch);
  const PlanArgs a{seqs, g, static_cast<int>(max_tiles), layout.tile_count, layout.starts, layout.order, layout.tiles};
  plan_sequences_kernel<<<1, kPlanThreads, 0, stream>>>(a);
  check_cuda(cudaGetLastError(), "plan_sequences_kernel: launch failed");
  const long long blocks = (max_tiles + 255) / 256;
  if (blocks > 0) {
    fill_tiles_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(a);
    check_cuda(cudaGetLastError(), "fill_tiles_kernel: launch failed");
  }
  return {layout.tiles, layout.tile_count};
}

}  // namespace warpattn::detail
