// The decode plan's pieces (hopper/decode/decode_plan.hpp) against brute force: GQA packing
// visits every (position, head) once in position-major order; splits cover every key block
// once, in order, evenly; batch-invariant splits depend on the sequence's length alone; the
// default split count stays in its bounds; paged rows follow the block table; the 64-row tiles
// of the 512 kernel pack every row once; the split combine reads each partial-state column once.
#include <algorithm>
#include <random>
#include <vector>

#include "harness.hpp"
#include "hopper/decode/combine_slices.hpp"
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
  for (int trial = 0; trial < 40000; ++trial) {
    const long long tiles = static_cast<long long>(rng() % 400);
    const int blocks = static_cast<int>(rng() % 2000), sms = 1 + static_cast<int>(rng() % 200);
    const int bw = trial % 2 ? 0 : 1 + static_cast<int>(rng() % 300);  // bandwidth_ctas, or none
    const int s = default_splits(tiles, blocks, sms, bw);
    CHECK(s >= 1 && s <= kMaxDecodeSplits) << s;
    if (s > 1) {
      CHECK(2 * s <= blocks) << "at least two key blocks a split: " << s << " " << blocks;
      CHECK(split_rounds_cost(tiles, blocks, sms, s, bw) < split_rounds_cost(tiles, blocks, sms, 1, bw))
          << "a split only where the model says it finishes sooner than the whole tiles";
    }
    // The least modelled cost over every allowed count, the fewest pieces among equals.
    for (int t = 1; t <= kMaxDecodeSplits && 2 * t <= blocks; ++t) {
      const long long a = split_rounds_cost(tiles, blocks, sms, s, bw), b = split_rounds_cost(tiles, blocks, sms, t, bw);
      CHECK(a < b || (a == b && s <= t) || tiles <= 0) << tiles << " " << blocks << " " << sms << ": " << s << " vs " << t;
    }
    // Tiles that fill whole rounds of the SMs stay whole.
    if (tiles > 0 && tiles % sms == 0) CHECK(s == 1) << tiles << " tiles on " << sms << " SMs split " << s;
    // The bandwidth floor only takes pieces away: never more than the rounds alone choose.
    if (bw > 0) CHECK(s <= default_splits(tiles, blocks, sms)) << tiles << " " << blocks << " " << sms << " " << bw;
  }
  // The example: B = 8, 32/8 heads, one new row (one packed tile per KV head), 4096
  // cached keys in 176-key blocks (24), 132 SMs: 64 tiles, two pieces each (one round of 128).
  CHECK(default_splits(64, 24, 132) == 2);
  CHECK(default_splits(64, 32, 132) == 2);   // 128-key blocks: 2 pieces of 16
  CHECK(default_splits(8, 32, 132) == 16);   // B = 1: capped by two blocks a split
  CHECK(default_splits(512, 32, 132) == 1);  // B = 64: the tiles fill the card
  CHECK(default_splits(140, 32, 132) == 4);  // a second round of 8 tiles: 560 pieces in 5 rounds of 8 + 1
  // With the 16-bit d = 128 cache's bandwidth floor on the H200 (4.8 TB/s: 64 CTAs, run 194; a
  // decode step's 4 rows a tile): B = 8 4K stays whole (64 CTAs reach the device's rate; two
  // halves cost the same blocks and the combine), B = 1 64K takes 8 pieces of 64 blocks, not 16
  // of 32, B = 2 16K 4 pieces of 32 (64 CTAs), not 8. An unknown bandwidth (0) is the H200's.
  const int h200 = 4915, h100 = 3352;  // GB/s from their memory clocks and bus widths
  const int bw = cache_bandwidth_ctas(false, 3LL * 128 * 256 * 2, 4, h200);
  CHECK(bw == 64) << bw;
  CHECK(cache_bandwidth_ctas(false, 3LL * 128 * 256 * 2, 4, 0) == 64);
  CHECK(cache_bandwidth_ctas(true, 3LL * 128 * 256, 4, h200) == 0);        // E4M3: the rounds alone
  CHECK(cache_bandwidth_ctas(false, 3LL * 128 * 256 * 2, 128, h200) == 0);  // full tiles: their GEMMs bound them
  CHECK(cache_bandwidth_ctas(false, 2LL * 128 * 128 * 2, 1, h200) == 192);  // d = 64's 64 KB ring
  CHECK(default_splits(64, 32, 132, bw) == 1);
  CHECK(default_splits(8, 512, 132, bw) == 8);
  CHECK(default_splits(16, 128, 132, bw) == 4);
  CHECK(default_splits(512, 32, 132, bw) == 1);
  // On the H100 (3.35 TB/s) 128 CTAs: B = 8 4K in two halves, B = 1 64K in 16 pieces, B = 64
  // 4K whole (its 512 tiles take four rounds either way).
  const int slow = cache_bandwidth_ctas(false, 3LL * 128 * 256 * 2, 4, h100);
  CHECK(slow == 128) << slow;
  CHECK(cache_bandwidth_ctas(true, 3LL * 128 * 256, 4, h100) == 0);
  CHECK(cache_bandwidth_ctas(false, 3LL * 128 * 256 * 2, 128, h100) == 0);
  CHECK(default_splits(64, 32, 132, slow) == 2);
  CHECK(default_splits(8, 512, 132, slow) == 16);
  CHECK(default_splits(16, 128, 132, slow) == 8);
  CHECK(default_splits(512, 32, 132, slow) == 1);
}

// The 512 kernel's tiles are 64 rows (kvcache_block_m), both consumer warpgroups on them: GQA
// packing at 64 rows as at 128 covers every (position, query head) of a sequence once over the
// tiles (block of positions, chunk of heads), each tile within its rows.
// The L2 evict-first policy for a launch's K / V boxes (run 250): at most three L2s of cache
// bytes, so on a 50 MB L2 a BF16 B = 8 4K step (134 MB) takes it and B = 1 64K (268 MB) does not;
// a device that reports no L2 never takes it.
TEST(cache_evict_first_only_for_short_steps) {
  const long long l2 = 50LL << 20, row = 8LL * 128 * 2 * 2;  // Hkv = 8, d = 128, K and V, BF16
  CHECK(cache_evict_first(8 * 4096 * row, l2));
  CHECK(cache_evict_first(1 * 16384 * row, l2));
  CHECK(!cache_evict_first(1 * 65536 * row, l2));
  CHECK(!cache_evict_first(8 * 16384 * row / 2, l2));  // E4M3 B = 8 16K: 268 MB
  CHECK(cache_evict_first(3 * l2, l2) && !cache_evict_first(3 * l2 + 1, l2));
  CHECK(!cache_evict_first(1, 0));
}

TEST(kvcache_tiles_pack_every_row_once_at_64_and_128_rows) {
  CHECK(kvcache_block_m(64) == 128 && kvcache_block_m(128) == 128 && kvcache_block_m(256) == 128);
  CHECK(kvcache_block_m(512) == 64);
  for (int block_m : {64, 128})
    for (int group : {1, 2, 3, 4, 6, 8, 12, 16, 32, 40, 64, 96, 128, 160, 200})
      for (int sq : {1, 2, 5, 17, 130}) {
        const GqaPacking p = gqa_packing(group, block_m);
        CHECK(p.heads >= 1 && group % p.heads == 0 && p.heads * p.positions <= block_m && p.positions >= 1)
            << block_m << " " << group;
        const int m_blocks = (sq + p.positions - 1) / p.positions, chunks = group / p.heads;
        // The split combine's row groups (combine_slices.hpp) from run_kvcache's tile_rows: the
        // 128-row tiles' two warpgroups, the 512 kernel's shared rows.
        const int tile_rows = std::min(sq, p.positions) * p.heads;
        const int row_groups = combine_row_groups(2, block_m == 64, tile_rows);
        std::vector<int> seen(sq * group, 0);
        for (int m = 0; m < m_blocks; ++m)
          for (int c = 0; c < chunks; ++c)
            for (int row = 0; row < block_m; ++row) {  // epilogue.cuh's packed_row_place
              const PackedRow pr = packed_row(row, p.heads);
              const int position = m * p.positions + pr.position, head = c * p.heads + pr.head_in_group;
              if (pr.position >= p.positions || position >= sq) continue;  // not stored
              ++seen[position * group + head];
              CHECK(block_m == 64 || row / 64 < row_groups) << "a stored row past the combine's row groups: block_m "
                                                            << block_m << " group " << group << " sq " << sq;
            }
        for (int v : seen) CHECK(v == 1) << "block_m " << block_m << " group " << group << " sq " << sq;
      }
}

// ---- The split combine's CTAs (combine_slices.hpp) against the consumers' partial states:
// warpgroup w stores part w of a slot, o_cols columns of its rows (its own 64 rows, or where the
// warpgroups share the rows, d = 512, columns [w o_cols, (w + 1) o_cols) of rows 0-63). Every
// (row group, column) of the head dim is read once, from the part that holds it, at the float4
// group that holds it, and the slice's columns (where it stores) are those columns.
TEST(combine_slices_read_each_column_of_each_part_once) {
  struct Kernel {
    int head_dim, o_cols, warpgroups;
    bool shared_rows;
  };
  for (const Kernel k : {Kernel{64, 64, 2, false}, Kernel{128, 128, 2, false}, Kernel{256, 256, 2, false},
                         Kernel{512, 256, 2, true}}) {
    const int row_groups = combine_row_groups(k.warpgroups, k.shared_rows, 128);
    CHECK(row_groups == (k.shared_rows ? 1 : k.warpgroups)) << k.head_dim;
    CHECK(combine_row_groups(k.warpgroups, k.shared_rows, 64) == 1 && combine_row_groups(k.warpgroups, k.shared_rows, 4) == 1);
    CHECK(combine_row_groups(k.warpgroups, k.shared_rows, 65) == (k.shared_rows ? 1 : 2));
    const int slices = k.head_dim / kCombineSliceCols;
    // (rows warpgroup, head-dim column) -> reads; and each part's float4 groups -> reads
    std::vector<int> column_reads(k.warpgroups * k.head_dim, 0), group_reads(k.warpgroups * (k.o_cols / 8), 0);
    for (int y = 0; y < row_groups; ++y)
      for (int slice = 0; slice < slices; ++slice) {
        const CombineSlice cs = combine_slice(y, slice, k.o_cols, k.shared_rows);
        CHECK(cs.part >= 0 && cs.part < k.warpgroups) << k.head_dim << " " << y << " " << slice;
        CHECK(cs.rows_warpgroup == (k.shared_rows ? 0 : y)) << k.head_dim << " " << y << " " << slice;
        if (!k.shared_rows) {
          CHECK(cs.part == y) << "a warpgroup's rows are in its own part";
        }
        for (int g = 0; g < kCombineSliceCols / 8; ++g) {
          const int group = cs.first_group + g;
          CHECK(group >= 0 && group < k.o_cols / 8) << k.head_dim << " " << slice << " " << g;
          ++group_reads[cs.part * (k.o_cols / 8) + group];
          // The part's group holds head-dim columns part x o_cols + 8 group .. + 7 where the rows
          // are shared (part w: warpgroup w's columns), 8 group .. otherwise; the CTA stores
          // them at slice x 32 + 8 g.
          const int column = (k.shared_rows ? cs.part * k.o_cols : 0) + 8 * group;
          CHECK(column == slice * kCombineSliceCols + 8 * g) << k.head_dim << " " << slice << " " << g;
          for (int c = 0; c < 8; ++c) ++column_reads[cs.rows_warpgroup * k.head_dim + column + c];
        }
      }
    for (int w = 0; w < k.warpgroups; ++w)
      for (int c = 0; c < k.head_dim; ++c)
        CHECK(column_reads[w * k.head_dim + c] == (k.shared_rows && w > 0 ? 0 : 1)) << k.head_dim << " " << w << " " << c;
    for (int v : group_reads) CHECK(v == 1) << k.head_dim;
  }
}
