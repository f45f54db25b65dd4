// The tile-range and mask decisions of the forward kernel (hopper/kv_tiles.hpp) against brute
// force over every (query row, key) pair.
#include <algorithm>
#include <cstdio>

#include "harness.hpp"
#include "hopper/kv_tiles.hpp"

using warpattn::detail::kv_tile_count;
using warpattn::detail::kv_tile_needs_mask;

namespace {

bool visible(int row, int key, int sq, int sk, bool causal) {
  return key < sk && (!causal || key <= row + sk - sq);
}

// For one configuration: the visited tiles are exactly those holding a key visible to some
// row of the block, and a visited tile is flagged for masking exactly when it holds a
// (row, key) pair that is not visible (including keys past seqlen_k).
int mismatches(int block_m, int block_n, int sq, int sk, bool causal) {
  int bad = 0;
  for (int m = 0; m * block_m < sq; ++m) {
    const int r0 = m * block_m, r1 = std::min(sq, r0 + block_m);
    int want_count = 0;
    for (int n = 0; n * block_n < sk; ++n)
      for (int r = r0; r < r1; ++r)
        for (int key = n * block_n; key < (n + 1) * block_n; ++key)
          if (visible(r, key, sq, sk, causal)) want_count = n + 1;
    const int count = kv_tile_count(m, block_m, block_n, sq, sk, causal);
    if (count != want_count) {
      if (bad++ < 3)
        std::printf("    count: Bm=%d Bn=%d sq=%d sk=%d causal=%d m=%d: got %d want %d\n", block_m,
                    block_n, sq, sk, causal, m, count, want_count);
    }
    for (int n = 0; n < want_count; ++n) {
      bool any_masked = false;
      for (int r = r0; r < r1; ++r)
        for (int key = n * block_n; key < (n + 1) * block_n; ++key)
          any_masked |= !visible(r, key, sq, sk, causal);
      if (kv_tile_needs_mask(n, block_n, r0, sq, sk, causal) != any_masked) {
        if (bad++ < 3)
          std::printf("    mask: Bm=%d Bn=%d sq=%d sk=%d causal=%d m=%d n=%d: got %d want %d\n",
                      block_m, block_n, sq, sk, causal, m, n, !any_masked, any_masked);
      }
    }
  }
  return bad;
}

}  // namespace

TEST(kv_tiles_match_brute_force) {
  const int seqlens[] = {1, 2, 17, 63, 64, 65, 127, 128, 129, 200, 300, 513};
  const int tiles[][2] = {{128, 128}, {128, 80}, {128, 176}, {64, 64}};
  int bad = 0;
  for (auto& t : tiles)
    for (int sq : seqlens)
      for (int sk : seqlens)
        for (bool causal : {false, true}) bad += mismatches(t[0], t[1], sq, sk, causal);
  CHECK(bad == 0) << bad << " mismatches";
}

TEST(kv_tiles_rows_before_the_first_key_get_no_tiles) {
  // seqlen_q > seqlen_k under a causal mask: the first seqlen_q - seqlen_k rows see no key.
  CHECK(kv_tile_count(0, 128, 128, 1000, 17, true) == 0);
  CHECK(kv_tile_count(7, 128, 128, 1000, 17, true) == 1);
  CHECK(kv_tile_count(0, 128, 128, 17, 1000, true) == 8);  // bottom-right: row 16 sees all keys
}

TEST(few_key_blocks_are_those_whose_first_row_sees_under_the_limit) {
  using warpattn::detail::kPreciseKeyLimit;
  using warpattn::detail::sees_few_keys;
  CHECK(sees_few_keys(0, 65536, 65536, true));  // row 0 sees 1 key
  CHECK(sees_few_keys(126, 65536, 65536, true));   // row 126 sees 127
  CHECK(!sees_few_keys(128, 65536, 65536, true));  // row 128 sees 129
  CHECK(sees_few_keys(0, 1000, kPreciseKeyLimit - 1, false));
  CHECK(!sees_few_keys(0, 1000, kPreciseKeyLimit, false));
  CHECK(sees_few_keys(0, 4097, 1000, true));  // seqlen_q > seqlen_k: early rows see no key
}

#include <set>
#include <tuple>

#include "hopper/tile_order.hpp"

// Every (query block, head, batch) exactly once; chunks of chunk_heads (batch, head) pairs;
// inside a chunk the query blocks never increase (longest causal blocks first).
TEST(tile_order_is_a_permutation_chunked_and_longest_first) {
  using warpattn::detail::ForwardParams;
  int bad = 0;
  for (int m_blocks : {1, 3, 128})
    for (int heads : {1, 5, 16})
      for (int batch : {1, 3})
        for (int chunk : {1, 4, 7, 1000}) {
          ForwardParams p;
          p.m_blocks = m_blocks, p.heads_q = heads, p.batch = batch;
          p.chunk_heads = std::min(chunk, heads * batch);
          std::set<std::tuple<int, int, int>> seen;
          int prev_chunk = -1, prev_m = 0;
          for (int t = 0; t < warpattn::detail::total_tiles(p); ++t) {
            const auto w = warpattn::detail::tile_coords(t, p);
            const bool in_range = w.m_block >= 0 && w.m_block < m_blocks && w.head >= 0 &&
                                  w.head < heads && w.batch >= 0 && w.batch < batch;
            const int hb_chunk = (w.batch * heads + w.head) / p.chunk_heads;
            bad += !in_range || !seen.insert({w.m_block, w.head, w.batch}).second;
            if (hb_chunk == prev_chunk) bad += w.m_block > prev_m;  // never a longer block later
            else bad += hb_chunk != prev_chunk + 1;                 // chunks in order
            prev_chunk = hb_chunk, prev_m = w.m_block;
          }
          bad += static_cast<int>(seen.size()) != m_blocks * heads * batch;
        }
  CHECK(bad == 0) << bad << " violations";
}
