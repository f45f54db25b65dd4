// Which key/value tiles a block of query rows visits, and which of them need a mask.
// Host-and-device functions so the CPU tests check them against brute force.
#pragma once

#include "hopper/host_device.hpp"

namespace warpattn::detail {

WARPATTN_HOST_DEVICE int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The keys a query row sees: a band around its diagonal. Row i's diagonal is key
// i + seqlen_k - seqlen_q (aligned bottom-right, as FlashAttention 2 and 3); it sees keys
// diagonal - left .. diagonal + right that exist. Causal attention is right = 0; a sliding
// window (FlashAttention's window_size = (left, right)) bounds either side; kUnbounded leaves a
// side open, and its arithmetic is skipped.
//
// 32-bit arithmetic, safe because validation keeps every bounded side below seqlen_q + seqlen_k
// (a wider one bounds nothing: kUnbounded) and, where a window is set, seqlen_q + seqlen_k below
// kUnbounded = 2^30; causal's right = 0 needs neither: row + seqlen_k - seqlen_q + 1 <= seqlen_k.
inline constexpr int kUnbounded = 1 << 30;
struct KeyBand {
  int left = kUnbounded, right = kUnbounded;
};
WARPATTN_HOST_DEVICE KeyBand causal_band(bool causal) { return {kUnbounded, causal ? 0 : kUnbounded}; }

// Row `row`'s visible keys: [band_key_begin, band_key_end), empty when end <= begin. Both are
// non-decreasing in row, so a block of rows sees keys in [begin(first row), end(last row)).
WARPATTN_HOST_DEVICE int band_key_begin(int row, int seqlen_q, int seqlen_k, const KeyBand& b) {
  if (b.left == kUnbounded) return 0;
  const int first = row + (seqlen_k - seqlen_q) - b.left;
  return first > 0 ? first : 0;
}
WARPATTN_HOST_DEVICE int band_key_end(int row, int seqlen_q, int seqlen_k, const KeyBand& b) {
  if (b.right == kUnbounded) return seqlen_k;
  const int end = row + (seqlen_k - seqlen_q) + b.right + 1;
  return end < seqlen_k ? end : seqlen_k;
}
// How many keys row `row` sees.
WARPATTN_HOST_DEVICE int band_keys(int row, int seqlen_q, int seqlen_k, const KeyBand& b) {
  const int n = band_key_end(row, seqlen_q, seqlen_k, b) - band_key_begin(row, seqlen_q, seqlen_k, b);
  return n > 0 ? n : 0;
}

// The key tiles [begin, end) that hold a key some row of query block `m_block` sees (begin ==
// end: none, every row of the block is empty: O = 0, LSE = -inf). Tiles are visited from end - 1
// down to begin.
struct KeyTileRange {
  int begin, end;
  WARPATTN_HOST_DEVICE int count() const { return end - begin; }
};
WARPATTN_HOST_DEVICE KeyTileRange kv_tile_range(int m_block, int block_m, int block_n, int seqlen_q, int seqlen_k,
                                                const KeyBand& band) {
  const int first_row = m_block * block_m;
  const int last_row = (first_row + block_m < seqlen_q ? first_row + block_m : seqlen_q) - 1;
  const int begin = band_key_begin(first_row, seqlen_q, seqlen_k, band);
  const int end = band_key_end(last_row, seqlen_q, seqlen_k, band);
  if (end <= begin) return {0, 0};
  return {begin / block_n, ceil_div(end, block_n)};
}

// The part of a work tile's key range [n_end - n_tiles, n_end) that one consumer warpgroup's
// rows [first_row, first_row + rows) see: its rows' own band, which is narrower than the block's
// by the rows of the other warpgroups (on a 256-key window with 80-key tiles, 5 tiles of the
// block's 6). Visited downwards like the block's: `front` tiles of the block first that the
// warpgroup skips, then its `count`, then the rest skipped. count == 0 (front == n_tiles): no
// row of the warpgroup sees a key of the range (rows past seqlen_q, or a band that misses it).
struct WarpgroupTiles {
  int front, count;
};
WARPATTN_HOST_DEVICE WarpgroupTiles warpgroup_key_tiles(int first_row, int rows, int block_n, int seqlen_q,
                                                        int seqlen_k, const KeyBand& band, int n_end, int n_tiles) {
  const WarpgroupTiles none{n_tiles, 0};
  const int last_row = (first_row + rows < seqlen_q ? first_row + rows : seqlen_q) - 1;
  if (last_row < first_row) return none;
  const int begin = band_key_begin(first_row, seqlen_q, seqlen_k, band);
  const int end = band_key_end(last_row, seqlen_q, seqlen_k, band);
  if (end <= begin) return none;
  const int lo = begin / block_n > n_end - n_tiles ? begin / block_n : n_end - n_tiles;
  const int hi = ceil_div(end, block_n) < n_end ? ceil_div(end, block_n) : n_end;
  if (hi <= lo) return none;
  return {n_end - hi, hi - lo};
}

// Number of key tiles [0, count) that hold at least one key visible to some row of query
// block `m_block`, without a left bound (the backward's ranges, key_block_work.hpp, and the
// split tail's, where every tile starts at key 0).
WARPATTN_HOST_DEVICE int kv_tile_count(int m_block, int block_m, int block_n, int seqlen_q,
                                       int seqlen_k, bool causal) {
  return kv_tile_range(m_block, block_m, block_n, seqlen_q, seqlen_k, causal_band(causal)).end;
}

// Which key tiles of the block of block_m rows starting at m_start need a mask: those at or
// past right_from (keys past seqlen_k, which TMA fills with zeros, not -inf, or right of the
// first row's band) and those below left_below (keys left of the last row's band). Worked out
// once per work tile: two registers across the main loop rather than the band's terms.
struct MaskedTiles {
  int right_from, left_below;
  WARPATTN_HOST_DEVICE bool needs(int n) const { return n >= right_from || n < left_below; }
};
WARPATTN_HOST_DEVICE MaskedTiles masked_tiles(int m_start, int block_m, int block_n, int seqlen_q, int seqlen_k,
                                              const KeyBand& band) {
  const int last_row = (m_start + block_m < seqlen_q ? m_start + block_m : seqlen_q) - 1;
  // Tile n holds keys [n block_n, (n + 1) block_n): it passes the end E iff n >= E / block_n.
  const int right_from = band_key_end(m_start, seqlen_q, seqlen_k, band) / block_n;
  const int left_below = band.left == kUnbounded ? 0 : ceil_div(band_key_begin(last_row, seqlen_q, seqlen_k, band), block_n);
  return {right_from, left_below};
}
// True when some score of key tile n, for some row of that block, must be masked.
WARPATTN_HOST_DEVICE bool kv_tile_needs_mask(int n, int block_n, int m_start, int block_m, int seqlen_q,
                                             int seqlen_k, const KeyBand& band) {
  return masked_tiles(m_start, block_m, block_n, seqlen_q, seqlen_k, band).needs(n);
}
// The same without a left bound (the backward).
WARPATTN_HOST_DEVICE bool kv_tile_needs_mask(int n, int block_n, int m_start, int seqlen_q, int seqlen_k,
                                             bool causal) {
  const int end_key = (n + 1) * block_n;
  return end_key > seqlen_k || end_key > band_key_end(m_start, seqlen_q, seqlen_k, causal_band(causal));
}

// Rows that see fewer keys than this get P in two 16-bit parts (run_precise): an output row
// averaging k keys carries P's rounding error (bf16: 2^-9 relative, uniform) as about
// 2^-9 / sqrt(3) * |v| / sqrt(k_eff), where k_eff ~ k / e for N(0, 1) scores. From 128 keys on,
// with |v| up to 4.5 that is ~7e-4, half the 1.5e-3 elementwise bound FlashAttention-3 is held
// to (the 64K causal test checks rows just above the limit). 256 put half of the query blocks
// at N = 512 causal on the slower path.
inline constexpr int kPreciseKeyLimit = 128;

// True when some row of the query block of block_m rows starting at m_start sees fewer than
// kPreciseKeyLimit keys. A row's count (band_keys) is concave in the row (the least of two
// increasing lines minus the greatest of two), so the block's least is at its first or last row.
WARPATTN_HOST_DEVICE bool sees_few_keys(int m_start, int block_m, int seqlen_q, int seqlen_k, const KeyBand& band) {
  const int last_row = (m_start + block_m < seqlen_q ? m_start + block_m : seqlen_q) - 1;
  const int first = band_keys(m_start, seqlen_q, seqlen_k, band), last = band_keys(last_row, seqlen_q, seqlen_k, band);
  return (first < last ? first : last) < kPreciseKeyLimit;
}

// The same for a KV cache's tile (decode: rows are the step's new positions, aligned
// bottom-right on the sequence's keys): its own rows, or the prefill block that holds its first
// row's position. A causal prefill of the sequence (seqlen_q = seqlen_k, query blocks of
// prefill_block_m rows) takes the precise path for a whole block when some row of it sees few
// keys, so a decode step whose row lies in such a block takes it too, and its bits equal the
// prefill's for that row (issue 18): without this, a sequence of exactly prefill_block_m keys
// decoded its last row on the fast path, while the prefill's first block (whose first row sees
// one key) took the precise one.
WARPATTN_HOST_DEVICE bool kvcache_sees_few_keys(int m_start, int rows, int seqlen_q, int seqlen_k, const KeyBand& band,
                                                int prefill_block_m) {
  if (sees_few_keys(m_start, rows, seqlen_q, seqlen_k, band)) return true;
  const int position = seqlen_k - seqlen_q + m_start;  // >= 0 here: a row before the first key sees none
  if (position < 0) return true;
  const int block_start = position / prefill_block_m * prefill_block_m;
  return sees_few_keys(block_start, prefill_block_m, seqlen_k, seqlen_k, band);
}

}  // namespace warpattn::detail
