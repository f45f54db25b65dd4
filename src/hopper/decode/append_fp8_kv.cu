// The append into an E4M3 cache (append_kv.hpp, append_fp8_kv): a warp per new row of one
// (sequence, KV head), as append_kv's, lane l the row's elements 4l .. 4l + 3 (+ 128, ...): their
// K codes in one 4-byte store, their V codes as four 1-byte stores into the row's 16-key slice of
// its Vᵀ page (16 bytes apart: fp8_cache_layout.hpp). Those scattered stores are d bytes a row:
// small beside the step that reads the cache.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hopper/cuda_check.hpp"
#include "hopper/decode/e4m3_code.cuh"
#include "hopper/decode/append_kv.hpp"
#include "hopper/decode/append_rows.cuh"
#include "hopper/decode/fp8_cache_layout.hpp"

namespace warpattn::detail {
namespace {

struct Fp8AppendArgs {
  const char* k_new;
  const char* v_new;
  int64_t new_stride[3];  // k_new's (and v_new's: validated alike) batch, row, head strides, elements
  int64_t v_new_stride[3];
  uint8_t* k_cache;
  int64_t k_stride[3];  // page, row, head (bytes: one per element)
  uint8_t* vt_cache;
  int64_t vt_stride[3];  // page, head, 16-key slice (bytes)
  CacheDescales descales;
  int64_t rows;  // B x S_new x Hkv
  int new_rows, heads_kv, head_dim;
  const int* cache_seqlens;
  KvPages pages;
  int capacity;
};

template <class T>
__global__ void __launch_bounds__(32 * kAppendWarpsPerBlock)
    append_fp8_kv_kernel(const __grid_constant__ Fp8AppendArgs a) {
  for_each_appended_row(a.rows, a.new_rows, a.heads_kv, a.cache_seqlens, a.pages, a.capacity, [=](const AppendedRow& row,
                                                                                                    int lane) {
    const int b = row.b, i = row.i, h = row.h;
    const float kd = a.descales.k[h * a.descales.k_stride], vd = a.descales.v[h * a.descales.v_stride];
    const T* k_row = reinterpret_cast<const T*>(a.k_new) + b * a.new_stride[0] + i * a.new_stride[1] + h * a.new_stride[2];
    const T* v_row =
        reinterpret_cast<const T*>(a.v_new) + b * a.v_new_stride[0] + i * a.v_new_stride[1] + h * a.v_new_stride[2];
    uint8_t* k_out = a.k_cache + row.at.page * a.k_stride[0] + row.at.row * a.k_stride[1] + h * a.k_stride[2];
    // The key's 16-key slice of its page's Vᵀ, at column 0 (kFp8KeyOrder within the slice).
    uint8_t* vt_out = a.vt_cache + row.at.page * a.vt_stride[0] + h * a.vt_stride[1] +
                      row.at.row / 16 * a.vt_stride[2] + fp8_vt_byte_in_slice(row.at.row, 0);
    for (int c = 4 * lane; c < a.head_dim; c += 128) {
      const uint2 kraw = *reinterpret_cast<const uint2*>(k_row + c), vraw = *reinterpret_cast<const uint2*>(v_row + c);
      const T* kx = reinterpret_cast<const T*>(&kraw);
      const T* vx = reinterpret_cast<const T*>(&vraw);
      uint32_t codes = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) codes |= static_cast<uint32_t>(e4m3_code(to_float(kx[j]), kd)) << (8 * j);
      *reinterpret_cast<uint32_t*>(k_out + c) = codes;
#pragma unroll
      for (int j = 0; j < 4; ++j) vt_out[16 * (c + j)] = e4m3_code(to_float(vx[j]), vd);
    }
  });
}

}  // namespace

void append_fp8_kv(const TensorView& k_new, const TensorView& v_new, const TensorView& k_cache,
                   const TensorView& v_cache, const CacheDescales& descales, const int* cache_seqlens,
                   const KvPages& pages, int capacity, cudaStream_t stream) {
  Fp8AppendArgs a{static_cast<const char*>(k_new.data),
                  static_cast<const char*>(v_new.data),
                  {k_new.stride[0], k_new.stride[1], k_new.stride[2]},
                  {v_new.stride[0], v_new.stride[1], v_new.stride[2]},
                  static_cast<uint8_t*>(k_cache.data),
                  {k_cache.stride[0], k_cache.stride[1], k_cache.stride[2]},
                  static_cast<uint8_t*>(v_cache.data),
                  {v_cache.stride[0], v_cache.stride[1], v_cache.stride[2]},
                  descales,
                  k_new.shape[0] * k_new.shape[1] * k_new.shape[2],
                  static_cast<int>(k_new.shape[1]),
                  static_cast<int>(k_new.shape[2]),
                  static_cast<int>(k_new.shape[3]),
                  cache_seqlens,
                  pages,
                  capacity};
  if (a.rows == 0) return;
  const unsigned blocks = append_blocks(a.rows);
  if (k_new.dtype == DType::bf16)
    append_fp8_kv_kernel<__nv_bfloat16><<<blocks, 32 * kAppendWarpsPerBlock, 0, stream>>>(a);
  else
    append_fp8_kv_kernel<__half><<<blocks, 32 * kAppendWarpsPerBlock, 0, stream>>>(a);
  check_cuda(cudaGetLastError(), "append_fp8_kv_kernel: launch failed");
}

}  // namespace warpattn::detail
