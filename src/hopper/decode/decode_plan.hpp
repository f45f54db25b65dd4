// Decode (issue 16; docs/decode-design.md): how one call's work is cut, as host-and-device
// functions that the CPU tests check against brute force before any kernel uses them.
//
// A decode work tile is one (sequence, KV head, split): its rows are the query heads that share
// the KV head at every new query position (GQA packing), so K and V are read once per KV head;
// its keys are one split of the sequence's cache. Splits that a sequence's keys are cut into
// are merged by a combine pass through their LSEs, in split order.
#pragma once

#include "hopper/host_device.hpp"

namespace warpattn::detail {

// ---- GQA packing. Row r of a tile is query position r / group, query head
// head_kv · group + r % group: position-major, so that a position's heads (adjacent in a
// (B, Sq, Hq, d) tensor) are adjacent rows, one TMA box {d, group, positions}.
struct PackedRow {
  int position, head_in_group;
};
WARPATTN_HOST_DEVICE PackedRow packed_row(int row, int group) { return {row / group, row % group}; }
WARPATTN_HOST_DEVICE int packed_rows(int seqlen_q, int group) { return seqlen_q * group; }

// How a KV-cache launch packs its tiles' rows: `heads` query heads of one KV head (a divisor
// of the GQA group, at most the tile's rows) at each of `positions` query positions, row r
// being position r / heads of head r % heads (packed_row). heads = 1 is the unpacked layout.
// A tile then covers positions x heads <= block_m rows; its work item is (block of positions,
// chunk of `heads` query heads, sequence).
struct GqaPacking {
  int heads = 1, positions = 0;
};
// A KV-cache tile's rows, by the compiled head dim (ForwardConfig::kBlockM of its kernel): 128,
// or 64 for the 512 kernel (whose two consumer warpgroups share 64 rows, each half of the head
// dim). Validation packs with it before the kernel is chosen (run_kvcache.cuh checks the two agree).
WARPATTN_HOST_DEVICE constexpr int kvcache_block_m(int kernel_head_dim) { return kernel_head_dim > 256 ? 64 : 128; }

// The largest divisor of the group that fits the tile: every query head of the group at once
// where the group has at most block_m heads (so K and V are read once per KV head).
WARPATTN_HOST_DEVICE GqaPacking gqa_packing(int group, int block_m) {
  int heads = group < block_m ? group : block_m;
  while (heads > 1 && group % heads != 0) --heads;
  if (heads < 1) heads = 1;
  return {heads, block_m / heads};
}

// ---- Splits of a sequence's keys. Key blocks [begin, end) of split `split` out of `splits`
// over `key_blocks` blocks: as even as whole blocks allow (sizes differ by at most one block),
// in order, covering every block once. A split past the blocks (more splits than blocks) is
// empty. 32-bit arithmetic (the producer that works it out has 40 registers, and a 64-bit
// division is a call): exact while splits x key_blocks < 2^32, which holds for splits <=
// kMaxDecodeSplits = 128 and key_blocks < 2^25 (a capacity below 2^31 keys, validated, in
// blocks of at least 80 keys).
struct KeyBlockRange {
  int begin = 0, end = 0;
  WARPATTN_HOST_DEVICE bool empty() const { return end <= begin; }
};
WARPATTN_HOST_DEVICE KeyBlockRange split_key_blocks(int split, int splits, int key_blocks) {
  const unsigned n = static_cast<unsigned>(key_blocks), d = static_cast<unsigned>(splits);
  const unsigned b = static_cast<unsigned>(split) * n / d, e = static_cast<unsigned>(split + 1) * n / d;
  return {static_cast<int>(b), static_cast<int>(e)};
}

// Batch-invariant splits (issue 18): chunks of a fixed number of key blocks, so that a
// sequence's splits, their order and so its bits depend on its own length alone, never on the
// batch, the SM count or the other sequences. chunk_blocks: the chunk in key blocks (> 0).
WARPATTN_HOST_DEVICE int invariant_splits(int key_blocks, int chunk_blocks) {
  return key_blocks <= 0 ? 1 : (key_blocks + chunk_blocks - 1) / chunk_blocks;
}
// A split past the sequence's chunks is empty, at its end.
WARPATTN_HOST_DEVICE KeyBlockRange invariant_key_blocks(int split, int chunk_blocks, int key_blocks) {
  const int b = split * chunk_blocks < key_blocks ? split * chunk_blocks : key_blocks;
  const int e = b + chunk_blocks < key_blocks ? b + chunk_blocks : key_blocks;
  return {b, e};
}

// The default split count, from the shape and the SM count: the count whose pieces finish
// soonest on the persistent grid, by a model of whole rounds. tiles x s pieces on
// `multiprocessors` CTAs take ceil(tiles s / multiprocessors) rounds of one piece, and a piece
// costs its ceil(key_blocks / s) key blocks plus a fixed part (its Q load, its partial state's
// store and share of the combine: about kSplitPieceCost key blocks); ties go to fewer pieces, so
// tiles that fill the SMs' rounds as well alone stay whole. At most kMaxDecodeSplits (the
// combine's work per row) and two key blocks a piece. tiles: (sequence, head chunk, query block)
// triples; key_blocks: the longest sequence's (the capacity's, when the lengths are on the device).
// B = 8, 32/8 heads, one row, 4096 keys in 128-key blocks, 132 SMs: 64 tiles of 32 blocks -> 2
// pieces of 16 (128 pieces in one round), not 5 (320 pieces in 3 rounds, the last 42% full).
//
// bandwidth_ctas (0: none): the device's memory bandwidth as a number of CTAs streaming at once,
// past which more pieces only share it. The rounds' key blocks then never cost less than the
// launch's blocks over that many CTAs, so a launch that reaches it with fewer pieces keeps
// them (and skips the combine). Run 194 (BF16, d = 128): the B = 8 4K step took 46.0 us on 64
// whole tiles against 48.1 on 128 halves; B = 1 64K 83.4 us in 8 splits against 84.0 in 16.
inline constexpr int kMaxDecodeSplits = 128;
inline constexpr int kSplitPieceCost = 1;
WARPATTN_HOST_DEVICE long long split_rounds_cost(long long tiles, int key_blocks, int multiprocessors, int splits,
                                                 int bandwidth_ctas = 0) {
  const long long rounds = (tiles * splits + multiprocessors - 1) / multiprocessors;
  long long blocks = rounds * ((key_blocks + splits - 1) / splits);
  if (bandwidth_ctas > 0) {
    const long long floor = (tiles * key_blocks + bandwidth_ctas - 1) / bandwidth_ctas;
    blocks = blocks > floor ? blocks : floor;
  }
  return blocks + rounds * kSplitPieceCost;
}
WARPATTN_HOST_DEVICE int default_splits(long long tiles, int key_blocks, int multiprocessors, int bandwidth_ctas = 0) {
  if (tiles <= 0 || key_blocks <= 2 || multiprocessors <= 0) return 1;
  const int limit = key_blocks / 2 < kMaxDecodeSplits ? key_blocks / 2 : kMaxDecodeSplits;
  int best = 1;
  long long best_cost = split_rounds_cost(tiles, key_blocks, multiprocessors, 1, bandwidth_ctas);
  for (int s = 2; s <= limit; ++s) {
    const long long cost = split_rounds_cost(tiles, key_blocks, multiprocessors, s, bandwidth_ctas);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}
// A 16-bit cache's bandwidth_ctas, for tiles of at most kBandwidthMaxRows real rows (a decode
// step's: the key tiles' bytes, not the GEMMs, set a CTA's pace): the CTAs whose rings' bytes in
// flight reach the device's rate (Little's law: a CTA's rate follows its bytes in flight), found
// on two cards with d = 128's ring (3 stages of 128 keys of K and V, 192 KB); a ring of fewer
// bytes takes proportionally more CTAs. On the H200 (4.8 TB/s) 64 CTAs did: B = 8 4K took 46.0 us
// on 64 whole tiles against 48.1 on 128 halves, B = 1 64K the same in 8 or 16 splits (runs 194,
// 196). On the H100 (3.35 TB/s) they did not: 128 CTAs were 7-10% faster (B = 8 4K 62.1 us in two
// splits against 66.7 whole, B = 1 64K 108.6 in 16 against 120.5 in 8; runs 216, 220), its
// loaded memory latency being longer at the same bytes a second. So a device whose memory peaks
// below kBandwidthSlowGbps takes the H100's 128, any other (or an unknown one: 0) the H200's 64;
// no other card has been measured. Fuller tiles are bound by their GEMMs and keep the rounds
// alone (0): run 196's B = 8 16K step with 128 rows a tile (64/8 heads, 16 positions) took 184 us
// whole against 155 in two splits (run 194), while with 64 rows (32/8 heads) whole and halves
// were even (147.3, 145.6). The E4M3 cache's step is not bound by bandwidth at those counts (run
// 194: B = 8 4K 34.2 us in two splits against 37.0 whole): 0 as well.
inline constexpr long long kBandwidthRingBytes = 64LL * 192 * 1024;  // the H200's
inline constexpr long long kSlowBandwidthRingBytes = 128LL * 192 * 1024;  // the H100's
inline constexpr int kBandwidthSlowGbps = 4000;
inline constexpr int kBandwidthMaxRows = 16;
WARPATTN_HOST_DEVICE constexpr int cache_bandwidth_ctas(bool fp8, long long ring_bytes, int tile_rows,
                                                        int memory_gbps) {
  const long long reach = memory_gbps > 0 && memory_gbps < kBandwidthSlowGbps ? kSlowBandwidthRingBytes
                                                                              : kBandwidthRingBytes;
  return fp8 || ring_bytes <= 0 || tile_rows > kBandwidthMaxRows ? 0
                                                                 : static_cast<int>((reach + ring_bytes - 1) / ring_bytes);
}

// Whether a KV-cache launch loads its K / V boxes under an L2 evict-first policy
// (KvPages::l2_evict_first): where the cache bytes it may read (cache_bytes: an upper bound from
// the batch and the capacity, the lengths being on the device) are at most
// kEvictFirstMaxL2Multiple x the L2. Run 250 (an H100, 50 MB of L2, 3 passes against the normal
// policy): B = 8 4K 0.956x the time (BF16, 134 MB) and 0.910x (E4M3, 67 MB), B = 1 16K 0.912x /
// 0.927x, B = 8 1K 0.930x, B = 64 1K E4M3 (134 MB) 0.954x; B = 1 64K (268 / 134 MB) and B = 64 1K
// BF16 (268 MB) level; but longer streams slower, 1.013-1.033x (BF16, 537 MB to 4.3 GB) and
// 1.053-1.084x (E4M3, 268 MB up), so those keep the normal policy. Where the gain comes from:
// a short step's lines replace each other instead of the lines the kernels before it left dirty
// in the L2, whose write-back would share the step's DRAM time.
inline constexpr long long kEvictFirstMaxL2Multiple = 3;
WARPATTN_HOST_DEVICE constexpr bool cache_evict_first(long long cache_bytes, long long l2_bytes) {
  return l2_bytes > 0 && cache_bytes <= kEvictFirstMaxL2Multiple * l2_bytes;
}

// The batch-invariant mode's chunks (KvCacheWork::chunk_keys), from the call's shape alone:
// kInvariantChunkKeys keys, or kInvariantKeysPerRow per real row of a tile where that is more,
// so that a chunk's partial state (its rows' O in fp32, written and read again by the combine)
// stays near 2 x rows / chunk_keys = 1/32 of the chunk's K and V bytes (run 143: chunks of 2048
// keys for 128-row tiles took 1.14x the default's time, their states ~19% of the cache's
// bytes). A cache of up to 2048 keys is one chunk.
inline constexpr int kInvariantChunkKeys = 2048, kInvariantKeysPerRow = 64;
WARPATTN_HOST_DEVICE int invariant_chunk_keys(int tile_rows) {
  return tile_rows * kInvariantKeysPerRow > kInvariantChunkKeys ? tile_rows * kInvariantKeysPerRow : kInvariantChunkKeys;
}
// The most chunks a tile takes in that mode (KvCacheWork::max_chunks), from the call's shape
// alone: enough for one sequence's tiles (tiles_per_sequence: its blocks of positions x chunks
// of packed heads, the same for every sequence of a call) to make about
// kInvariantSequencePieces pieces, one round of the persistent grid when the sequence is
// alone, and never more than kMaxDecodeSplits. Past that, a long cache's chunks grow instead of
// multiplying: run 147's B = 1 64K step (8 tiles) took 32 chunks of 2048 keys a tile, 256
// pieces in two rounds, 1.29x the default's 16 pieces a tile in one round.
inline constexpr int kInvariantSequencePieces = 128;
WARPATTN_HOST_DEVICE int invariant_max_chunks(long long tiles_per_sequence) {
  if (tiles_per_sequence <= 1) return kMaxDecodeSplits;
  const long long n = (kInvariantSequencePieces + tiles_per_sequence - 1) / tiles_per_sequence;
  return n < kMaxDecodeSplits ? static_cast<int>(n) : kMaxDecodeSplits;
}
// A tile of key_blocks blocks of block_n keys: chunks of chunk_keys keys in whole blocks, or
// more where the tile would need more than max_chunks (1 .. kMaxDecodeSplits) of them, from its
// own key count.
WARPATTN_HOST_DEVICE int invariant_chunk_blocks(int key_blocks, int block_n, int chunk_keys, int max_chunks) {
  const int by_keys = (chunk_keys + block_n - 1) / block_n;
  const int by_splits = (key_blocks + max_chunks - 1) / max_chunks;
  return by_keys > by_splits ? by_keys : by_splits;
}
// A launch's split count in that mode: enough for every tile of at most key_blocks blocks (the
// capacity's); a tile with fewer chunks leaves the rest of its pieces empty, which the combine
// adds as exact zeros, so its bits do not see them.
WARPATTN_HOST_DEVICE int invariant_launch_splits(int key_blocks, int block_n, int chunk_keys, int max_chunks) {
  const int n = invariant_splits(key_blocks, (chunk_keys + block_n - 1) / block_n);
  return n < max_chunks ? n : max_chunks;
}

// ---- A KV-cache launch's work (run_kvcache.cuh), enumerated on the device without a plan:
// tiles (block of positions, chunk of packed heads, sequence) in tile_order.hpp's order over a
// TileGrid of one chunk of heads, each cut into `splits` consecutive pieces of its key range,
// `pieces` = tiles x splits in all (chunk_keys > 0, the batch-invariant mode: each tile's
// pieces are its invariant_chunk_blocks chunks, then empty ones, not an even cut). Sequence b's keys: cache_seqlens[b] clamped to [0, capacity]
// (the capacity without cache_seqlens), plus the appended rows, at most the capacity.
struct KvCacheWork {
  const int* cache_seqlens = nullptr;
  int appended = 0, capacity = 0, splits = 1, pieces = 0;
  int chunk_keys = 0;
  int max_chunks = kMaxDecodeSplits;  // with chunk_keys: invariant_max_chunks
};
WARPATTN_HOST_DEVICE int kv_cache_keys(const KvCacheWork& w, int batch) {
  int cached = w.capacity;
  if (w.cache_seqlens != nullptr) {
    const int n = w.cache_seqlens[batch];
    cached = n < 0 ? 0 : (n > w.capacity ? w.capacity : n);
  }
  const long long keys = static_cast<long long>(cached) + w.appended;
  return keys < w.capacity ? static_cast<int>(keys) : w.capacity;
}

}  // namespace warpattn::detail
