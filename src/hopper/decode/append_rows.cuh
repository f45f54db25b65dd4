// The row walk both appends share (append_kv.cu, append_fp8_kv.cu): a warp per new row of one
// (sequence, KV head), rows r = (b x S_new + i) x Hkv + h over the grid, and where each lands:
// key cache_seqlens[b] + i (the length clamped to [0, capacity]) of sequence b, dropped past
// the capacity or on a page index outside the cache.
#pragma once
#include <algorithm>
#include <cstdint>

#include "hopper/decode/kv_pages.hpp"

namespace warpattn::detail {

inline constexpr int kAppendWarpsPerBlock = 8;

// A new row and where it goes: batch b, row i of the new ones, KV head h, the cache's page and row.
struct AppendedRow {
  int b, i, h;
  CacheBox at;
};

// f(row, lane) for each of `rows` new rows that lands in the cache, by the warp the row falls to.
// (The appends pass a lambda capturing their kernel argument by value: by reference, taking the
// __grid_constant__ parameter's address cost append_kv_kernel a stack frame and spills.)
template <class F>
__device__ __forceinline__ void for_each_appended_row(int64_t rows, int new_rows, int heads_kv,
                                                      const int* cache_seqlens, const KvPages& pages, int capacity,
                                                      F&& f) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kAppendWarpsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kAppendWarpsPerBlock + threadIdx.x / 32; r < rows; r += warps) {
    AppendedRow row;
    row.h = static_cast<int>(r % heads_kv);
    row.i = static_cast<int>(r / heads_kv % new_rows);
    row.b = static_cast<int>(r / heads_kv / new_rows);
    const int cached = min(max(cache_seqlens[row.b], 0), capacity);
    const int64_t key = static_cast<int64_t>(cached) + row.i;
    if (key >= capacity) continue;
    row.at = cache_box(pages, row.b, static_cast<int>(key), capacity);
    if (row.at.page < 0) continue;  // a page index outside the cache: never written
    f(row, lane);
  }
}

// The grid of an append of `rows` rows (grid-stride beyond 2^16 blocks).
inline unsigned append_blocks(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>((rows + kAppendWarpsPerBlock - 1) / kAppendWarpsPerBlock, 1 << 16));
}

}  // namespace warpattn::detail
