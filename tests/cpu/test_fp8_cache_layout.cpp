// The E4M3 KV cache's layout (src/hopper/decode/fp8_cache_layout.hpp): the Vᵀ key order is
// the inverse of warpattn/fp8.hpp's kFp8KeyOrder, and every (page, row, head, column) of K and of
// V has its own byte inside its page's block, K row-major as the 16-bit cache, V transposed in
// 16-key slices (a slice's d rows of 16 keys contiguous: the P·V GEMM's tile layout).
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "harness.hpp"
#include "hopper/decode/fp8_cache_layout.hpp"
#include "reference/fp8_cache.hpp"
#include "warpattn/fp8.hpp"

using namespace warpattn::detail;

TEST(fp8_vt_column_inverts_the_key_order) {
  for (int g = 0; g < 4; ++g)
    for (int s = 0; s < 16; ++s) {
      const int key = 16 * g + warpattn::kFp8KeyOrder[s];
      CHECK(fp8_vt_column(key) == 16 * g + s) << "key " << key << " in column " << fp8_vt_column(key)
                                              << ", kFp8KeyOrder puts it in " << 16 * g + s;
    }
}

TEST(fp8_cache_offsets_cover_each_byte_once) {
  for (const Fp8CacheShape s : {Fp8CacheShape{3, 16, 2, 64}, Fp8CacheShape{2, 48, 1, 128}, Fp8CacheShape{1, 256, 3, 16}}) {
    const int64_t bytes = s.num_pages * s.page_size * s.heads_kv * s.head_dim;
    std::vector<int> k_seen(bytes, 0), v_seen(bytes, 0);
    for (int64_t page = 0; page < s.num_pages; ++page)
      for (int row = 0; row < s.page_size; ++row)
        for (int head = 0; head < s.heads_kv; ++head)
          for (int col = 0; col < s.head_dim; ++col) {
            const int64_t k = fp8_cache_k_offset(s, page, row, head, col), v = fp8_cache_vt_offset(s, page, row, head, col);
            CHECK(k >= 0 && k < bytes && v >= 0 && v < bytes) << "offset out of the pages";
            if (k < 0 || k >= bytes || v < 0 || v >= bytes) return;
            ++k_seen[k], ++v_seen[v];
            // Each page's bytes are its own block (a page moves as a unit in a block table).
            const int64_t page_bytes = s.page_size * s.heads_kv * s.head_dim;
            CHECK(k / page_bytes == page && v / page_bytes == page) << "page " << page << " row " << row;
            // K as the 16-bit cache (one byte an element); Vᵀ: the 16 keys of a slice's column
            // contiguous, in the key order, and the slice's columns one after the other.
            CHECK(k == ((page * s.page_size + row) * s.heads_kv + head) * s.head_dim + col);
            const int64_t slice = (page * s.heads_kv + head) * (s.page_size / 16) + row / 16;
            CHECK(v / (16 * s.head_dim) == slice && v % (16 * s.head_dim) / 16 == col &&
                  v % 16 == fp8_vt_column(row) % 16)
                << "page " << page << " row " << row << " head " << head << " col " << col << ": Vt byte " << v;
          }
    int64_t k_bad = 0, v_bad = 0;
    for (int64_t i = 0; i < bytes; ++i) k_bad += k_seen[i] != 1, v_bad += v_seen[i] != 1;
    CHECK(k_bad == 0 && v_bad == 0) << k_bad << " K bytes and " << v_bad << " V bytes not hit exactly once, page_size "
                                    << s.page_size;
  }
}

// The reference append: each new row's codes read back through the layout dequantise to within
// half an E4M3 step of the row (and to the row's own code exactly); every other byte (other
// rows, rows dropped for a bad page entry, unused pages) as it was.
TEST(fp8_cache_append_reference) {
  const Fp8CacheShape s{6, 16, 2, 32};
  const int64_t bytes = s.num_pages * s.page_size * s.heads_kv * s.head_dim;
  std::mt19937 rng(16);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<uint8_t> k(bytes, 0x5A), vt(bytes, 0x5A);
  const std::vector<int> table = {4, 1, -1, 2};  // the third page entry is invalid: its rows are dropped
  const int64_t start = 10, rows = 50;           // positions 10..59: pages 4, 1, (dropped), 2
  std::vector<float> nk(rows * s.heads_kv * s.head_dim), nv(nk.size());
  for (float& x : nk) x = normal(rng);
  for (float& x : nv) x = normal(rng);
  // Each head's descale from its rows' amax (amax / 448: no code saturates), one of them 4x larger.
  std::vector<float> k_descale(s.heads_kv, 0.f), v_descale(s.heads_kv, 0.f);
  for (size_t at = 0; at < nk.size(); ++at) {
    const int h = static_cast<int>(at / s.head_dim % s.heads_kv);
    k_descale[h] = std::max(k_descale[h], std::fabs(nk[at]) / 448.f);
    v_descale[h] = std::max(v_descale[h], std::fabs(nv[at]) / 448.f);
  }
  k_descale[1] *= 4.f;
  warpattn::reference::append_fp8_cache(s, k, vt, table, start, rows, nk, nv, k_descale, v_descale);
  std::vector<int> written(bytes, 0);
  int64_t far = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t p = start + i, page = table[p / s.page_size];
    if (page < 0) continue;
    const int row = static_cast<int>(p % s.page_size);
    for (int h = 0; h < s.heads_kv; ++h)
      for (int c = 0; c < s.head_dim; ++c) {
        const size_t at = (i * s.heads_kv + h) * s.head_dim + c;
        const int64_t ko = fp8_cache_k_offset(s, page, row, h, c), vo = fp8_cache_vt_offset(s, page, row, h, c);
        ++written[ko];
        const float kx = warpattn::host::e4m3_to_float(k[ko]) * k_descale[h];
        const float vx = warpattn::host::e4m3_to_float(vt[vo]) * v_descale[h];
        // half a step of E4M3 (2^-4 relative) or the subnormal quantum, in the value's units
        far += std::fabs(kx - nk[at]) > std::max(std::fabs(nk[at]) / 16.f, 0x1p-10f * k_descale[h]);
        far += std::fabs(vx - nv[at]) > std::max(std::fabs(nv[at]) / 16.f, 0x1p-10f * v_descale[h]);
        CHECK(k[ko] == warpattn::host::float_to_e4m3(nk[at] / k_descale[h]) &&
              vt[vo] == warpattn::host::float_to_e4m3(nv[at] / v_descale[h]));
      }
  }
  CHECK(far == 0) << far << " codes further than half an E4M3 step from their values";
  // K: every byte not written keeps its 0x5A (V's bytes are the same set, transposed).
  int64_t touched = 0;
  for (int64_t i = 0; i < bytes; ++i) touched += written[i] == 0 && k[i] != 0x5A;
  CHECK(touched == 0) << touched << " K bytes changed that no new row owns";
  // Rows 22..37 (page entry -1) were dropped, pages 0, 3 and 5 are untouched, both in K and Vᵀ.
  for (int64_t page : {0, 3, 5}) {
    const int64_t page_bytes = s.page_size * s.heads_kv * s.head_dim;
    int64_t changed = 0;
    for (int64_t b = page * page_bytes; b < (page + 1) * page_bytes; ++b) changed += k[b] != 0x5A || vt[b] != 0x5A;
    CHECK(changed == 0) << "page " << page << ": " << changed << " bytes changed";
  }
}
