// The append of a KV-cache call (append_kv.hpp): a warp per new row of one (sequence, KV head)
// (append_rows.cuh), lane l the row's 16-byte pieces l, l + 32, ... (one a lane at head dims up
// to 256, two up to 512).
#include <algorithm>
#include <cstdint>

#include "hopper/cuda_check.hpp"
#include "hopper/decode/append_kv.hpp"
#include "hopper/decode/append_rows.cuh"

namespace warpattn::detail {
namespace {

// One 16-bit tensor of the append: its base and strides (elements) over (batch or page, row,
// head); the head dim is contiguous.
struct RowTensor {
  char* data;
  int64_t stride[3];
  __device__ char* row(int64_t a, int64_t r, int64_t h) const {
    return data + 2 * (a * stride[0] + r * stride[1] + h * stride[2]);
  }
};
RowTensor row_tensor(const TensorView& t) {
  return {static_cast<char*>(t.data), {t.stride[0], t.stride[1], t.stride[2]}};
}

struct AppendArgs {
  RowTensor k_new, v_new, k_cache, v_cache;
  int64_t rows;  // B x S_new x Hkv
  int new_rows, heads_kv, k_pieces, v_pieces;  // pieces: 16 bytes of a row
  const int* cache_seqlens;
  KvPages pages;
  int capacity;
};

__global__ void __launch_bounds__(32 * kAppendWarpsPerBlock) append_kv_kernel(const __grid_constant__ AppendArgs a) {
  for_each_appended_row(a.rows, a.new_rows, a.heads_kv, a.cache_seqlens, a.pages, a.capacity,
                        [=](const AppendedRow& row, int lane) {
                          for (int piece = lane; piece < a.k_pieces; piece += 32)
                            reinterpret_cast<uint4*>(a.k_cache.row(row.at.page, row.at.row, row.h))[piece] =
                                reinterpret_cast<const uint4*>(a.k_new.row(row.b, row.i, row.h))[piece];
                          for (int piece = lane; piece < a.v_pieces; piece += 32)
                            reinterpret_cast<uint4*>(a.v_cache.row(row.at.page, row.at.row, row.h))[piece] =
                                reinterpret_cast<const uint4*>(a.v_new.row(row.b, row.i, row.h))[piece];
                        });
}

}  // namespace

void append_kv(const TensorView& k_new, const TensorView& v_new, const TensorView& k_cache, const TensorView& v_cache,
               const int* cache_seqlens, const KvPages& pages, int capacity, cudaStream_t stream) {
  AppendArgs a{row_tensor(k_new), row_tensor(v_new), row_tensor(k_cache), row_tensor(v_cache),
               k_new.shape[0] * k_new.shape[1] * k_new.shape[2], static_cast<int>(k_new.shape[1]),
               static_cast<int>(k_new.shape[2]), static_cast<int>(k_new.shape[3] / 8),
               static_cast<int>(v_new.shape[3] / 8), cache_seqlens, pages, capacity};
  if (a.rows == 0) return;
  append_kv_kernel<<<append_blocks(a.rows), 32 * kAppendWarpsPerBlock, 0, stream>>>(a);
  check_cuda(cudaGetLastError(), "append_kv_kernel: launch failed");
}

}  // namespace warpattn::detail
