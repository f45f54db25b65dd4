// The host's E4M3 KV-cache append (docs/decode-fp8-cache-design.md), the reference the append
// kernel will be checked against: new rows quantised with their KV head's descale
// (e4m3(x / descale), satfinite) and written at the cache's positions, K row-major, V into its
// page's Vᵀ (hopper/decode/fp8_cache_layout.hpp). Rows whose page entry is outside the cache are
// dropped, as the 16-bit cache's append drops them.
#pragma once

#include <cstdint>
#include <vector>

#include "common/host_fp8.hpp"
#include "hopper/decode/fp8_cache_layout.hpp"

namespace warpattn::reference {

// new_k, new_v: (rows, Hkv, d) floats; row i goes to key position start + i of the sequence
// whose block-table row is `table` (page of position p: table[p / page_size]).
inline void append_fp8_cache(const detail::Fp8CacheShape& s, std::vector<uint8_t>& k_pages, std::vector<uint8_t>& vt_pages,
                             const std::vector<int>& table, int64_t start, int64_t rows, const std::vector<float>& new_k,
                             const std::vector<float>& new_v, const std::vector<float>& k_descale,
                             const std::vector<float>& v_descale) {
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t position = start + i, slot = position / s.page_size;
    if (slot >= static_cast<int64_t>(table.size())) continue;
    const int64_t page = table[slot];
    if (page < 0 || page >= s.num_pages) continue;
    const int row = static_cast<int>(position % s.page_size);
    for (int head = 0; head < s.heads_kv; ++head)
      for (int col = 0; col < s.head_dim; ++col) {
        const size_t at = (i * s.heads_kv + head) * s.head_dim + col;
        k_pages[detail::fp8_cache_k_offset(s, page, row, head, col)] = host::float_to_e4m3(new_k[at] / k_descale[head]);
        vt_pages[detail::fp8_cache_vt_offset(s, page, row, head, col)] = host::float_to_e4m3(new_v[at] / v_descale[head]);
      }
  }
}

}  // namespace warpattn::reference
