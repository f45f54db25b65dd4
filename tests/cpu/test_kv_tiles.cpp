// The tile-range and mask decisions of the forward kernel (hopper/kv_tiles.hpp) against brute
// force over every (query row, key) pair.
#include <algorithm>
#include <array>
#include <initializer_list>
#include <cstdio>

#include "harness.hpp"
#include "hopper/backward/key_block_work.hpp"
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
  const int tiles[][2] = {{128, 128}, {128, 80}, {128, 176}, {64, 64}, {64, 80}};
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

TEST(few_key_blocks_are_those_with_a_row_under_the_limit) {
  using warpattn::detail::causal_band;
  using warpattn::detail::kPreciseKeyLimit;
  using warpattn::detail::sees_few_keys;
  const auto causal = causal_band(true), all = causal_band(false);
  CHECK(sees_few_keys(0, 128, 65536, 65536, causal));     // row 0 sees 1 key
  CHECK(sees_few_keys(126, 128, 65536, 65536, causal));   // row 126 sees 127
  CHECK(!sees_few_keys(128, 128, 65536, 65536, causal));  // row 128 sees 129
  CHECK(sees_few_keys(0, 128, 1000, kPreciseKeyLimit - 1, all));
  CHECK(!sees_few_keys(0, 128, 1000, kPreciseKeyLimit, all));
  CHECK(sees_few_keys(0, 128, 4097, 1000, causal));  // seqlen_q > seqlen_k: early rows see no key
  // A window of 100 keys: every row sees at most 101; of 300, none fewer once past the start.
  CHECK(sees_few_keys(1024, 128, 4096, 4096, {100, 0}));
  CHECK(!sees_few_keys(1024, 128, 4096, 4096, {300, 0}));
  CHECK(sees_few_keys(0, 128, 4096, 4096, {300, 0}));  // rows 0..126 see 1..127
}

// A KV cache's tile takes the precise path where the causal prefill's block holding its first
// row does (issue 18: a decode step's bits equal the prefill's last row), and wherever a row of
// its own sees few keys (the accuracy rule): one decode row of every length up to 700 against the
// prefill's block decision, and tiles of several positions against their own rows.
TEST(kvcache_tiles_take_the_prefill_blocks_precise_path) {
  using warpattn::detail::KeyBand;
  using warpattn::detail::kvcache_sees_few_keys;
  using warpattn::detail::sees_few_keys;
  const KeyBand bands[] = {{warpattn::detail::kUnbounded, 0}, {100, 0}, {127, 0}, {128, 0}, {300, 0}};
  for (const KeyBand& band : bands)
    for (int L = 1; L <= 700; ++L) {
      const int block = (L - 1) / 128 * 128;  // the prefill's block holding row L - 1
      const bool want = sees_few_keys(block, 128, L, L, band);
      CHECK(kvcache_sees_few_keys(0, 1, 1, L, band, 128) == want)
          << "L " << L << " band " << band.left << ": got " << !want << " want " << want;
    }
  CHECK(kvcache_sees_few_keys(0, 1, 1, 128, {warpattn::detail::kUnbounded, 0}, 128));    // the old exception
  CHECK(!kvcache_sees_few_keys(0, 1, 1, 129, {warpattn::detail::kUnbounded, 0}, 128));   // past the first block
  for (const KeyBand& band : bands)
    for (int L = 1; L <= 400; L += 7)
      for (int sq = 1; sq <= 40 && sq <= L + 8; sq += 3)
        for (int rows = 1; rows <= 16; rows *= 2)
          for (int m = 0; m < sq; m += rows)
            if (sees_few_keys(m, rows, sq, L, band)) CHECK(kvcache_sees_few_keys(m, rows, sq, L, band, 128));
}

// Every (tile shape {block_m, block_n}, seqlen_q, seqlen_k, band) of the lists, each with brute
// force's visibility of a (row, key) pair under that band.
template <class Fn>
void for_each_band_case(std::initializer_list<std::array<int, 2>> tiles, std::initializer_list<int> seqlens,
                        std::initializer_list<int> sides, Fn&& fn) {
  using warpattn::detail::KeyBand;
  using warpattn::detail::kUnbounded;
  for (const auto& t : tiles)
    for (int sq : seqlens)
      for (int sk : seqlens)
        for (int left : sides)
          for (int right : sides) {
            const KeyBand band{left, right};
            const auto visible = [&](long long row, long long key) {
              const long long diagonal = row + sk - sq;
              return key >= 0 && key < sk && (left == kUnbounded || key >= diagonal - left) &&
                     (right == kUnbounded || key <= diagonal + right);
            };
            fn(t, sq, sk, band, visible);
          }
}

// The band functions against brute force over every (row, key) pair, windows included: the
// visited range is exactly the tiles with a visible key, the masked tiles exactly those with a
// hidden pair, and sees_few_keys exactly "some row of the block sees 1..limit-1 keys or fewer".
TEST(band_tiles_match_brute_force) {
  using warpattn::detail::band_keys;
  using warpattn::detail::KeyBand;
  using warpattn::detail::kPreciseKeyLimit;
  using warpattn::detail::kUnbounded;
  using warpattn::detail::kv_tile_range;
  using warpattn::detail::sees_few_keys;
  // {80, 128}: the 80-row backward's; {64, 80}: the d = 256 backward's 80-key blocks
  int bad = 0, checked = 0;
  for_each_band_case(
      {{128, 128}, {128, 80}, {192, 112}, {80, 128}, {64, 80}}, {1, 17, 128, 129, 300, 513}, {0, 1, 63, 200, kUnbounded},
      [&](const std::array<int, 2>& t, int sq, int sk, const KeyBand& band, const auto& visible) {
        for (int m = 0; m * t[0] < sq; ++m) {
          const int r0 = m * t[0], r1 = std::min(sq, r0 + t[0]);
          int first = -1, last = -1, fewest = 1 << 30;
          for (int r = r0; r < r1; ++r) {
            int keys = 0;
            for (int key = 0; key < sk; ++key)
              if (visible(r, key)) {
                ++keys;
                if (first < 0 || key / t[1] < first) first = key / t[1];
                last = std::max(last, key / t[1]);
              }
            bad += keys != band_keys(r, sq, sk, band);
            fewest = std::min(fewest, keys);
          }
          const auto range = kv_tile_range(m, t[0], t[1], sq, sk, band);
          if (first < 0) bad += range.count() != 0;
          else bad += range.begin != first || range.end != last + 1;
          bad += sees_few_keys(r0, t[0], sq, sk, band) != (fewest < kPreciseKeyLimit);
          for (int n = range.begin; n < range.end; ++n) {
            bool any_hidden = false;
            for (int r = r0; r < r1 && !any_hidden; ++r)
              for (int key = n * t[1]; key < (n + 1) * t[1]; ++key) any_hidden |= !visible(r, key);
            bad += kv_tile_needs_mask(n, t[1], r0, t[0], sq, sk, band) != any_hidden;
          }
          ++checked;
        }
      });
  CHECK(bad == 0) << bad << " mismatches over " << checked << " blocks";
}

// A consumer warpgroup's own key tiles (warpgroup_key_tiles) against brute force: within its
// block's visited range, exactly the tiles holding a key some row of its 64 sees (contiguous),
// and none where no row of it exists or sees a key; also inside a block range cut short (a
// split's piece).
TEST(warpgroup_key_tiles_match_brute_force) {
  using warpattn::detail::KeyBand;
  using warpattn::detail::kUnbounded;
  using warpattn::detail::kv_tile_range;
  using warpattn::detail::warpgroup_key_tiles;
  int bad = 0, checked = 0, narrower = 0;
  for_each_band_case(
      {{128, 128}, {128, 80}, {192, 112}, {128, 64}, {128, 176}}, {1, 17, 64, 65, 129, 300, 513},
      {0, 1, 63, 200, 255, kUnbounded},
      [&](const std::array<int, 2>& t, int sq, int sk, const KeyBand& band, const auto& visible) {
        for (int m = 0; m * t[0] < sq; ++m) {
          const auto range = kv_tile_range(m, t[0], t[1], sq, sk, band);
          for (int cut = 0; cut < 2; ++cut) {
            // cut: the range without its first tile (a piece ending below the block's end)
            const int n_end = range.end - (cut && range.count() > 1 ? 1 : 0);
            const int n_tiles = n_end - range.begin;
            if (n_tiles <= 0) continue;
            for (int wg = 0; wg * 64 < t[0]; ++wg) {
              const int r0 = m * t[0] + wg * 64, r1 = std::min(sq, r0 + 64);
              int lo = -1, hi = -1;
              for (int n = range.begin; n < n_end; ++n) {
                bool any = false;
                for (int r = r0; r < r1 && !any; ++r)
                  for (int key = n * t[1]; key < (n + 1) * t[1] && !any; ++key) any = visible(r, key);
                if (!any) continue;
                if (lo < 0) lo = n;
                bad += hi >= 0 && hi != n;  // a gap: the warpgroup's tiles would not be contiguous
                hi = n + 1;
              }
              const auto own = warpgroup_key_tiles(r0, 64, t[1], sq, sk, band, n_end, n_tiles);
              if (lo < 0)
                bad += own.count != 0 || own.front != n_tiles;
              else
                bad += own.front != n_end - hi || own.count != hi - lo;
              narrower += own.count < n_tiles;
              ++checked;
            }
          }
        }
      });
  CHECK(bad == 0) << bad << " mismatches over " << checked << " warpgroups";
  CHECK(narrower > 0) << "no case where a warpgroup sees fewer tiles than its block";
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

#include <vector>

#include "hopper/split_tail.hpp"

// The split tail against brute force: every key tile of every tail tile in exactly one piece,
// ranges within one key tile of each other, at most two pieces per CTA, each tile's pieces from
// the CTAs first_cta..last_cta that have a range, distinct slots.
TEST(split_tail_covers_each_key_tile_once) {
  using warpattn::detail::SplitTail;
  int bad = 0, planned = 0;
  for (int ctas : {1, 7, 132})
    for (int total : {1, 5, 131, 133, 200, 1024, 2048, 2752})
      for (int kv_tiles : {1, 2, 3, 4, 32, 128, 129})
        for (int min_saved : {0, 1, 2}) {
          const SplitTail s = warpattn::detail::plan_split_tail(total, kv_tiles, ctas, min_saved);
          if (s.tiles == 0) {
            bad += s.first_tile != total;
            continue;
          }
          ++planned;
          bad += s.first_tile + s.tiles != total || s.first_tile % ctas != 0 || s.tiles >= ctas;
          std::vector<int> covered(s.tiles * static_cast<size_t>(kv_tiles), 0);
          std::vector<int> pieces_of_tile(s.tiles, 0);
          std::vector<int> slot_used(2 * ctas, 0);
          int shortest = s.steps(), longest = 0;
          for (int c = 0; c < ctas; ++c) {
            const int len = s.begin(c + 1) - s.begin(c);
            shortest = std::min(shortest, len), longest = std::max(longest, len);
            bad += len > 0 != s.has_range(c);
            int seen = 0;
            for (int i = 0; i < 3; ++i) {
              SplitTail::Piece pc;
              if (!s.piece(c, i, pc)) continue;
              bad += i == 2;  // never a third piece
              bad += pc.tile < 0 || pc.tile >= s.tiles || pc.kv_begin < 0 || pc.kv_end > kv_tiles ||
                     pc.kv_begin >= pc.kv_end;
              if (pc.tile < 0 || pc.tile >= s.tiles) continue;
              for (int j = pc.kv_begin; j < pc.kv_end; ++j) ++covered[pc.tile * static_cast<size_t>(kv_tiles) + j];
              seen += pc.kv_end - pc.kv_begin;
              ++pieces_of_tile[pc.tile];
              bad += c < s.first_cta(pc.tile) || c > s.last_cta(pc.tile);
              bad += s.tile_of_piece(c, pc.kv_begin) != pc.tile;
              const int slot = s.slot(c, pc.tile);
              bad += slot < 2 * c || slot > 2 * c + 1 || slot_used[slot]++ != 0;
            }
            bad += seen != len;
            bad += longest > kv_tiles - min_saved;
          }
          bad += longest - shortest > 1;
          for (int x : covered) bad += x != 1;
          for (int t = 0; t < s.tiles; ++t) {  // the combine's walk over a tile's CTAs
            int n = 0;
            for (int c = s.first_cta(t); c <= s.last_cta(t); ++c) n += s.has_range(c);
            bad += pieces_of_tile[t] != n;
          }
        }
  CHECK(planned > 20) << "only " << planned << " splits planned";
  CHECK(bad == 0) << bad << " violations";
}

// The shape the split is for: 1024 tiles of 128 key tiles on 132 SMs (d = 256, 16k tokens).
TEST(split_tail_plans_the_last_wave) {
  const auto s = warpattn::detail::plan_split_tail(1024, 128, 132, 2);
  CHECK(s.first_tile == 924 && s.tiles == 100) << s.first_tile << " " << s.tiles;
  CHECK(s.begin(132) == 12800 && s.begin(1) == 96) << s.begin(1);  // 96 or 97 key tiles each
  const auto none = warpattn::detail::plan_split_tail(1056, 128, 132, 2);  // 8 whole waves
  CHECK(none.tiles == 0 && none.first_tile == 1056);
  // d = 64, N = 1024 (run 59: -4% split): 4 tail tiles of 8 key tiles save 7 per CTA, under
  // the launch's threshold of 8.
  CHECK(warpattn::detail::plan_split_tail(4096, 8, 132, 8).tiles == 0);
}

// The backward's work per key block (hopper/backward/key_block_work.hpp): the query blocks a
// key block visits are exactly those with a (row, key) pair it must see; the last key block of
// a query block is the largest that visits it; the deterministic turns of a query block's key
// blocks are 0, 1, ... in the promised order (ascending, or descending under the mask).
TEST(backward_key_block_work_matches_brute_force) {
  using warpattn::detail::dq_turn;
  using warpattn::detail::last_key_block;
  using warpattn::detail::query_block_range;
  int bad = 0, configs = 0;
  for (int block_n : {128, 80})  // 80: the d = 256 backward's key blocks
  for (int block_m : {64, 80, 128})
    for (bool causal : {false, true})
      for (int sq : {1, 63, 64, 65, 200, 383, 700})
        for (int sk : {1, 100, 128, 129, 300, 900}) {
          ++configs;
          const int m_blocks = (sq + block_m - 1) / block_m, n_blocks = (sk + block_n - 1) / block_n;
          std::vector<std::vector<int>> visitors(m_blocks);
          for (int n = 0; n < n_blocks; ++n) {
            const auto range = query_block_range(n, block_n, block_m, sq, sk, causal);
            for (int m = 0; m < m_blocks; ++m) {
              bool sees = false;
              for (int r = m * block_m; r < std::min(sq, (m + 1) * block_m) && !sees; ++r)
                for (int key = n * block_n; key < std::min(sk, (n + 1) * block_n) && !sees; ++key)
                  sees = visible(r, key, sq, sk, causal);
              const bool visited = m >= range.begin && m < range.end;
              // Visiting a block without a visible pair costs time but is not wrong (P = 0 there);
              // missing one would be. Exact for these shapes: the range is tight.
              if (visited != sees) ++bad;
              if (visited) visitors[m].push_back(n);
            }
          }
          for (int m = 0; m < m_blocks; ++m) {
            if (visitors[m].empty()) continue;
            if (last_key_block(m, block_m, block_n, sq, sk, causal) != visitors[m].back()) ++bad;
            for (size_t i = 0; i < visitors[m].size(); ++i) {
              const int n = visitors[m][i];
              const int want = causal ? static_cast<int>(visitors[m].size() - 1 - i) : static_cast<int>(i);
              if (visitors[m][0] != 0 || dq_turn(n, m, block_m, block_n, sq, sk, causal) != want) ++bad;
            }
          }
        }
  CHECK(bad == 0) << bad << " mismatches over " << configs << " configurations";
}

// The same with sliding windows: the key blocks a query block meets are an interval (not from
// key block 0 any more), and the deterministic turns count the later ones of it.
TEST(backward_key_block_work_matches_brute_force_with_windows) {
  using warpattn::detail::dq_turn;
  using warpattn::detail::KeyBand;
  using warpattn::detail::kUnbounded;
  using warpattn::detail::last_key_block;
  using warpattn::detail::query_block_range;
  int bad = 0, configs = 0;
  for (int block_n : {128, 80})
  for (int block_m : {64, 80, 128})
    for (int left : {0, 50, 300, kUnbounded})
      for (int right : {0, 7, 200, kUnbounded})
        for (int sq : {1, 65, 200, 700})
          for (int sk : {1, 129, 300, 900}) {
            ++configs;
            const KeyBand band{left, right};
            const auto visible = [&](int row, int key) {
              const long long diagonal = static_cast<long long>(row) + sk - sq;
              return key < sk && (left == kUnbounded || key >= diagonal - left) &&
                     (right == kUnbounded || key <= diagonal + right);
            };
            const int m_blocks = (sq + block_m - 1) / block_m, n_blocks = (sk + block_n - 1) / block_n;
            std::vector<std::vector<int>> visitors(m_blocks);
            for (int n = 0; n < n_blocks; ++n) {
              const auto range = query_block_range(n, block_n, block_m, sq, sk, band);
              for (int m = 0; m < m_blocks; ++m) {
                bool sees = false;
                for (int r = m * block_m; r < std::min(sq, (m + 1) * block_m) && !sees; ++r)
                  for (int key = n * block_n; key < std::min(sk, (n + 1) * block_n) && !sees; ++key)
                    sees = visible(r, key);
                const bool visited = m >= range.begin && m < range.end;
                if (visited != sees) ++bad;
                if (visited) visitors[m].push_back(n);
              }
            }
            for (int m = 0; m < m_blocks; ++m) {
              if (visitors[m].empty()) continue;
              if (last_key_block(m, block_m, block_n, sq, sk, band) != visitors[m].back()) ++bad;
              for (size_t i = 0; i < visitors[m].size(); ++i) {
                const int n = visitors[m][i];
                if (i > 0 && n != visitors[m][i - 1] + 1) ++bad;  // an interval
                const int want = static_cast<int>(visitors[m].size() - 1 - i);
                if (dq_turn(n, m, block_m, block_n, sq, sk, true, band) != want) ++bad;
              }
            }
          }
  CHECK(bad == 0) << bad << " mismatches over " << configs << " configurations";
}

// The banded backward's launch order: every (key block, row) once, the groups' rows contiguous
// and nearly equal, key blocks non-decreasing within a group and all rows of a key block before
// the next; and the group count from the L2 budget.
TEST(backward_longest_first_order_is_a_grouped_permutation) {
  using warpattn::detail::grouped_longest_first;
  using warpattn::detail::longest_first_groups;
  int bad = 0, configs = 0;
  for (int n_blocks : {1, 2, 7, 52, 205})
    for (int rows : {1, 2, 3, 8, 32, 64, 129})
      for (int groups = 1; groups <= rows && groups <= 12; ++groups) {
        ++configs;
        std::vector<int> seen(static_cast<size_t>(n_blocks) * rows, 0);
        int prev_n = -1, prev_row = -1, group_first = 0;
        for (int t = 0; t < n_blocks * rows; ++t) {
          const auto o = grouped_longest_first(t, n_blocks, rows, groups);
          if (o.n_block < 0 || o.n_block >= n_blocks || o.row < 0 || o.row >= rows) {
            ++bad;
            break;
          }
          ++seen[static_cast<size_t>(o.n_block) * rows + o.row];
          // the group of this row, and its bounds
          int g = 0;
          while (static_cast<int64_t>(rows) * (g + 1) / groups <= o.row) ++g;
          const int first = static_cast<int>(static_cast<int64_t>(rows) * g / groups);
          const int size = static_cast<int>(static_cast<int64_t>(rows) * (g + 1) / groups) - first;
          if (size < rows / groups || size > rows / groups + 1) ++bad;
          if (t > 0 && first == group_first) {  // same group: (n, row) in order, row inner
            const bool next = (o.n_block == prev_n && o.row == prev_row + 1) ||
                              (o.n_block == prev_n + 1 && prev_row == first + size - 1 && o.row == first);
            if (!next) ++bad;
          } else if (t > 0 && !(first > group_first && o.n_block == 0 && o.row == first)) {
            ++bad;  // a new group starts at its first row's key block 0
          }
          prev_n = o.n_block, prev_row = o.row, group_first = first;
        }
        for (int c : seen) bad += c != 1;
      }
  CHECK(bad == 0) << bad << " mismatches over " << configs << " configurations";
  // 4096 queries at d = 128, 2 query heads a KV head: 8 MiB a row; 64 rows in 40 MiB: 5 a group.
  CHECK(longest_first_groups(64, 2, 4096, 128, int64_t{40} << 20) == 13);
  CHECK(longest_first_groups(64, 2, 4096, 128, int64_t{8} << 20) == 64);    // one row a group
  CHECK(longest_first_groups(64, 2, 4096, 128, int64_t{1} << 20) == 64);    // over budget: still 1
  CHECK(longest_first_groups(3, 1, 16, 64, int64_t{40} << 20) == 1);        // all in one
}

// The backward's walk orders (key_block_work.hpp; backward_config.hpp's kWalkDown and kRotate):
// with a cut tile's parts and GQA's query heads, every (query head, query block) pair of a key
// block is taken once; a walk starts at its range's first block (descending: last), moved by the
// rotation; rotated (mode 1) the key blocks that start together take different query blocks at
// every step.
#include "hopper/backward/tail_split.hpp"

namespace {
template <bool kDown, bool kRotate>
struct Walk {  // the two flags KeyBlockWork::m_block reads from a BackwardConfig
  static constexpr bool kWalkDown = kDown, kRotated = kRotate;
};

template <bool kDown, bool kRotated>
int walk_errors(int span, int group, int n_blocks, int mode, int parts, std::vector<int>& first_blocks) {
  using warpattn::detail::KeyBlockWork;
  int bad = 0;
  const int begin = 3, head_kv = 2;  // a range not from 0 (a band's), a KV head not the first
  for (int n = 0; n < n_blocks; ++n) {
    std::vector<int> seen(static_cast<size_t>(group) * span, 0);
    for (int part = parts == 1 ? -1 : 0; part < (parts == 1 ? 0 : parts); ++part) {  // -1: uncut
      KeyBlockWork w{};
      w.n_block = n, w.head_kv = head_kv, w.group = group, w.m = {begin, begin + span};
      const auto r = warpattn::detail::part_steps(w.all_steps(), part, parts);
      w.take_steps(r.begin, r.end);
      if (kRotated) w.rotation = warpattn::detail::walk_rotation(n, n_blocks, span, mode);
      for (int s = 0; s < w.steps(); ++s) {
        const int h = w.head(s) - head_kv * group, m = w.m_block<Walk<kDown, kRotated>>(s) - begin;
        if (h < 0 || h >= group || m < 0 || m >= span) {
          ++bad;
          continue;
        }
        ++seen[static_cast<size_t>(h) * span + m];
      }
      if (part == -1 && w.steps() > 0) {
        const int r = kRotated ? w.rotation : 0;  // where the walk starts
        if (w.m_block<Walk<kDown, kRotated>>(0) != (kDown ? begin + span - 1 - r : begin + r)) ++bad;
        if (kRotated && mode == 1) first_blocks.push_back(w.m_block<Walk<kDown, kRotated>>(0));
      }
    }
    for (int c : seen) bad += c != 1;
  }
  return bad;
}
}  // namespace

TEST(backward_walk_orders_cover_every_step_once) {
  using warpattn::detail::walk_rotation;
  int bad = 0, configs = 0;
  for (int span : {1, 2, 5, 52, 205})
    for (int group : {1, 2, 4})
      for (int n_blocks : {1, 3, 64, 128})
        for (int parts : {1, 2, 3}) {
          std::vector<int> unused;
          configs += 7;
          bad += walk_errors<false, false>(span, group, n_blocks, 0, parts, unused);
          bad += walk_errors<true, false>(span, group, n_blocks, 0, parts, unused);
          bad += walk_errors<false, true>(span, group, n_blocks, 0, parts, unused);  // rotation 0
          bad += walk_errors<false, true>(span, group, n_blocks, 2, parts, unused);
          bad += walk_errors<true, true>(span, group, n_blocks, 2, parts, unused);
          // mode 1: key blocks n != n' (both below span) start on different query blocks and walk
          // in step, so they never add into the same block at once
          for (bool down : {false, true}) {
            std::vector<int> first;
            bad += down ? walk_errors<true, true>(span, group, n_blocks, 1, parts, first)
                        : walk_errors<false, true>(span, group, n_blocks, 1, parts, first);
            if (parts > 1) continue;  // (the first blocks are an uncut walk's)
            first.resize(std::min(n_blocks, span));
            std::sort(first.begin(), first.end());
            if (std::adjacent_find(first.begin(), first.end()) != first.end()) ++bad;
          }
        }
  CHECK(bad == 0) << bad << " mismatches over " << configs << " configurations";
  // mode 2 spreads over the walk: key block n of 128 over 205 query blocks starts n x 205 / 128 on
  CHECK(walk_rotation(64, 128, 205, 2) == 102) << walk_rotation(64, 128, 205, 2);
  CHECK(walk_rotation(5, 128, 0, 1) == 0) << "no steps, no rotation";
}
