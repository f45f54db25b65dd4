// Where an E4M3 KV cache keeps each element (issue 16; docs/decode-fp8-cache-design.md), as
// host-and-device functions: the append kernel writes by them, the attention's producer loads
// by them (append_fp8_kv.cu; the attention reads Vᵀ through make_vt_slices_tensor_map), and the
// CPU tests check them.
//
// K pages keep the 16-bit cache's layout in one byte an element: (num_pages, page_size, Hkv, d).
// V pages are transposed, because FP8 wgmma reads its B operand K-major only, and cut into
// slices of 16 keys: (num_pages, Hkv, page_size / 16, 16 d), slice s of a page holding its keys
// 16 s .. 16 s + 15 as d rows of 16 bytes (head-dim column c at bytes 16 c .. 16 c + 15), in
// forward_fp8's Vᵀ order inside the slice (warpattn/fp8.hpp's kFp8KeyOrder: byte 16 c + j holds
// key 16 s + kFp8KeyOrder[j]). That is the shared-memory layout the P·V GEMM reads (wgmma's
// no-swizzle K-major core matrices, a 16-key slice after another), byte for byte, so a key tile
// arrives in rows of 128 bytes: the layout before it, (num_pages, Hkv, d, page_size), brought a
// tile in rows of 16 bytes, which streamed at 0.85 of the copy rate against 1.04 for 128-byte
// rows (run 189, tools/probes/p_vt_slices_rate.cu). page_size is a multiple of 16.
#pragma once

#include <cstdint>

#include "hopper/host_device.hpp"

namespace warpattn::detail {

struct Fp8CacheShape {
  int64_t num_pages = 0, page_size = 0, heads_kv = 0, head_dim = 0;
};

// Where key `key` of a run of keys goes in forward_fp8's Vᵀ order: its 16-key group's 16
// columns, and inside them the inverse of kFp8KeyOrder (kFp8KeyOrder = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15}: keys 2i and
// 2i + 1 of the group's first half go to columns 4i and 4i + 1, of its second half to 4i + 2
// and 4i + 3).
WARPATTN_HOST_DEVICE int fp8_vt_column(int key) {
  const int group = key / 16, k = key % 16;
  const int half = k / 8, pair = (k % 8) / 2, odd = k % 2;
  return 16 * group + 4 * pair + 2 * half + odd;
}

// The byte of (key row `row`'s, head-dim column `col`'s) value inside its 16-key slice.
WARPATTN_HOST_DEVICE int fp8_vt_byte_in_slice(int row, int col) { return 16 * col + fp8_vt_column(row) % 16; }

// Byte offsets into the K and the Vᵀ page arrays of (page, key row inside the page, KV head,
// column of the head dim).
WARPATTN_HOST_DEVICE int64_t fp8_cache_k_offset(const Fp8CacheShape& s, int64_t page, int row, int head, int col) {
  return ((page * s.page_size + row) * s.heads_kv + head) * s.head_dim + col;
}
WARPATTN_HOST_DEVICE int64_t fp8_cache_vt_offset(const Fp8CacheShape& s, int64_t page, int row, int head, int col) {
  return ((page * s.heads_kv + head) * (s.page_size / 16) + row / 16) * (16 * s.head_dim) +
         fp8_vt_byte_in_slice(row, col);
}

}  // namespace warpattn::detail
