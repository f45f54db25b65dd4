// The decode plan's pieces (hopper/decode/decode_plan.hpp) against brute force: GQA packing
// visits every (position, head) once in position-major order; splits cover every key block
// once, in order, evenly; batch-invariant splits depend on the sequence's length alone; the
// default split count stays in its bounds; paged rows follow the block table.
#include <random>
#include <vector>

#include "harness.hpp"
#include "hopper/decode/decode_plan.hpp"

using namespace warpattn::detail;

TEST(gqa_packing_is_position_major_and_covers_each_pair_once) {
  for (int group = 1; group <= 16; ++group)
    for (int sq = 1; sq <= 20; ++sq) {
      std::vector<int> seen(sq * group, 0);
      for (int r = 0; r < packed_rows(sq, group); ++r) {
        const PackedRow p = packed_row(r, group);
        CHECK(p.position >= 0 && p.position < sq && p.head_in_group >= 0 && p.head_in_group < group) << r;
        CHECK(p.position == r / group && p.head_in_group == r % group) << r;
        ++seen[p.position * group + p.head_in_group];
      }
      for (int v : seen) CHECK(v == 1) << "group " << group << " sq " << sq;
    }
}

TEST(splits_cover_every_key_block_once_in_order_and_evenly) {
  for (int blocks = 0; blocks <= 300; ++blocks)
    for (int splits = 1; splits <= 140; ++splits) {
      int next = 0, lo = blocks, hi = 0;
      for (int s = 0; s < splits; ++s) {
        const KeyBlockRange r = split_key_blocks(s, splits, blocks);
        CHECK(r.begin == next && r.end >= r.begin) << blocks << " " << splits << " " << s;
        next = r.end;
        lo = r.end - r.begin < lo ? r.end - r.begin : lo;
        hi = r.end - r.begin > hi ? r.end - r.begin : hi;
      }
      CHECK(next == blocks) << blocks << " " << splits;
      CHECK(hi - lo <= 1 || blocks == 0) << blocks << " " << splits;
    }
}

TEST(invariant_splits_depend_on_the_sequence_alone) {
  for (int chunk = 1; chunk <= 40; ++chunk)
    for (int blocks = 0; blocks <= 500; ++blocks) {
      const int n = invariant_splits(blocks, chunk);
      CHECK(n >= 1) << blocks;
      int next = 0;
      for (int s = 0; s < n; ++s) {
        const KeyBlockRange r = invariant_key_blocks(s, chunk, blocks);
        CHECK(r.begin == next) << blocks << " " << chunk << " " << s;
        CHECK(r.end - r.begin == chunk || s == n - 1) << "only the last chunk may be short";
        CHECK(r.end > r.begin || blocks == 0) << "no empty chunk";
        next = r.end;
      }
      CHECK(next == blocks || (blocks == 0 && next == 0)) << blocks << " " << chunk;
      // A prefix of a longer sequence is cut the same way: its chunks are the longer one's.
      const int longer = blocks + 7;
      for (int s = 0; s + 1 < n; ++s) {
        const KeyBlockRange a = invariant_key_blocks(s, chunk, blocks), b = invariant_key_blocks(s, chunk, longer);
        CHECK(a.begin == b.begin && a.end == b.end) << blocks << " " << chunk << " " << s;
      }
    }
}

TEST(default_splits_stay_in_bounds) {
  std::mt19937_64 rng(16);
  for (int trial = 0; trial < 20000; ++trial) {
    const long long tiles = static_cast<long long>(rng() % 400);
    const int blocks = static_cast<int>(rng() % 2000), sms = 1 + static_cast<int>(rng() % 200);
    const int s = default_splits(tiles, blocks, sms);
    CHECK(s >= 1 && s <= kMaxDecodeSplits) << s;
    if (s > 1) {
      CHECK(2 * s <= blocks) << "at least two key blocks a split: " << s << " " << blocks;
      CHECK(split_rounds_cost(tiles, blocks, sms, s) < split_rounds_cost(tiles, blocks, sms, 1))
          << "a split only where the model says it finishes sooner than the whole tiles";
    }
    // The least modelled cost over every allowed count, the fewest pieces among equals.
    for (int t = 1; t <= kMaxDecodeSplits && 2 * t <= blocks; ++t) {
      const long long a = split_rounds_cost(tiles, blocks, sms, s), b = split_rounds_cost(tiles, blocks, sms, t);
      CHECK(a < b || (a == b && s <= t) || tiles <= 0) << tiles << " " << blocks << " " << sms << ": " << s << " vs " << t;
    }
    // Tiles that fill whole rounds of the SMs stay whole.
    if (tiles > 0 && tiles % sms == 0) CHECK(s == 1) << tiles << " tiles on " << sms << " SMs split " << s;
  }
  // The example: B = 8, 32/8 heads, one new row (one packed tile per KV head), 4096
  // cached keys in 176-key blocks (24), 132 SMs: 64 tiles, two pieces each (one round of 128).
  CHECK(default_splits(64, 24, 132) == 2);
  CHECK(default_splits(64, 32, 132) == 2);   // 128-key blocks: 2 pieces of 16
  CHECK(default_splits(8, 32, 132) == 16);   // B = 1: capped by two blocks a split
  CHECK(default_splits(512, 32, 132) == 1);  // B = 64: the tiles fill the card
  CHECK(default_splits(140, 32, 132) == 4);  // a second round of 8 tiles: 560 pieces in 5 rounds of 8 + 1
}
