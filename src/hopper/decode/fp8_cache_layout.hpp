// Where an E4M3 KV cache keeps each element (issue 16; docs/decode-fp8-cache-design.md), as
// host-and-device functions: the append kernel writes by them, the attention's producer loads
// by them (append_fp8_kv.cu; the attention reads Vᵀ through make_vt_slices_tensor_map), and the
// CPU tests check them.
//
// K pages keep the 16-bit cache's layout in one byte an element: (num_pages, page_size, Hkv, d).
// V pages are transposed, (num_pages, Hkv, d, page_size), because FP8 wgmma reads its B operand
// K-major only: a page's row of d holds its keys' values of one column, in forward_fp8's Vᵀ
// order inside each group of 16 keys (warpattn/fp8.hpp's kFp8KeyOrder: column 16 g + s holds
// key 16 g + kFp8KeyOrder[s]), so the FP8 P·V GEMM takes them as it takes vt. page_size is a
// multiple of 16 (a TMA box row of Vᵀ is at least 16 bytes; the order works on 16-key groups).
#pragma once

#include <cstdint>

#include "hopper/host_device.hpp"

namespace warpattn::detail {

struct Fp8CacheShape {
  int64_t num_pages = 0, page_size = 0, heads_kv = 0, head_dim = 0;
};

// The Vᵀ column of key `key` inside its page: the inverse of kFp8KeyOrder within its 16-key
// group (kFp8KeyOrder = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15}: keys 2i and
// 2i + 1 of the group's first half go to columns 4i and 4i + 1, of its second half to 4i + 2
// and 4i + 3).
WARPATTN_HOST_DEVICE int fp8_vt_column(int key) {
  const int group = key / 16, k = key % 16;
  const int half = k / 8, pair = (k % 8) / 2, odd = k % 2;
  return 16 * group + 4 * pair + 2 * half + odd;
}

// Byte offsets into the K and the Vᵀ page arrays of (page, key row inside the page, KV head,
// column of the head dim).
WARPATTN_HOST_DEVICE int64_t fp8_cache_k_offset(const Fp8CacheShape& s, int64_t page, int row, int head, int col) {
  return ((page * s.page_size + row) * s.heads_kv + head) * s.head_dim + col;
}
WARPATTN_HOST_DEVICE int64_t fp8_cache_vt_offset(const Fp8CacheShape& s, int64_t page, int row, int head, int col) {
  return ((page * s.heads_kv + head) * s.head_dim + col) * s.page_size + fp8_vt_column(row);
}

}  // namespace warpattn::detail
