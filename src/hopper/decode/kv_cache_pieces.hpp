// A KV-cache launch's pieces of work (decode_plan.hpp, KvCacheWork): which tile, which part of
// its key range and how many keys its sequence has, for piece `piece` of the launch. The
// producer works it out for each piece it takes (no plan kernels before the launch: a decode
// step's latency), the combine for each tile; host-and-device, so the CPU tests check it.
#pragma once

#include "hopper/decode/decode_plan.hpp"
#include "hopper/host_device.hpp"
#include "hopper/kv_tiles.hpp"
#include "hopper/tile_order.hpp"

namespace warpattn::detail {

struct KvCachePiece {
  WorkTile tile;       // m_block: block of `positions` positions; head: chunk of packed heads
  int n_tiles, n_end;  // key tiles n_end - n_tiles .. n_end - 1 (n_tiles 0: an empty piece)
  int seqlen_k;        // the sequence's keys
};

// The tiles of a KV-cache launch: grid.m_blocks blocks of positions x grid.heads_q chunks x
// grid.batch sequences, in tile_coords' order (chunk_heads 1).
WARPATTN_HOST_DEVICE KvCachePiece kv_cache_piece(int piece, const KvCacheWork& w, const TileGrid& grid, int positions,
                                                 int block_n, int seqlen_q, const KeyBand& band) {
  const int u = piece / w.splits, split = piece - u * w.splits;
  const WorkTile t = tile_coords(u, grid);
  const int seqlen_k = kv_cache_keys(w, t.batch);
  const KeyTileRange r = kv_tile_range(t.m_block, positions, block_n, seqlen_q, seqlen_k, band);
  const int blocks = r.count();
  const KeyBlockRange s =
      w.chunk_keys > 0 ? invariant_key_blocks(split, invariant_chunk_blocks(blocks, block_n, w.chunk_keys, w.max_chunks), blocks)
                       : split_key_blocks(split, w.splits, blocks);
  return {t, s.end - s.begin, r.begin + s.end, seqlen_k};
}

// ---- Stream-K (KvCacheWork::stream_ctas > 0; LeanAttention's decomposition): global key block
// b is block b mod stream_tile_blocks of tile b / stream_tile_blocks, and CTA c takes blocks
// [c x total / ctas, (c + 1) x total / ctas), so every CTA of the launch streams the same number
// of blocks (+-1), whichever tiles they belong to. Each tile a CTA's range touches is one
// fragment of it: whole (written out directly) or cut among several CTAs (a partial state each,
// merged by the combine).
// 32-bit throughout (the producer's few registers): a launch takes stream-K only where
// stream_blocks x (stream_ctas + 1) < 2^31 (run_kvcache.cuh's kvcache_stream_k).
WARPATTN_HOST_DEVICE int kv_stream_begin(const KvCacheWork& w, int cta) {
  return w.stream_blocks * cta / w.stream_ctas;
}
// The CTA whose range holds global block b.
WARPATTN_HOST_DEVICE int kv_stream_cta(const KvCacheWork& w, int b) {
  return ((b + 1) * w.stream_ctas + w.stream_blocks - 1) / w.stream_blocks - 1;
}
// The CTAs that share tile u: first, and how many.
struct KvStreamShare {
  int first, count;
};
WARPATTN_HOST_DEVICE KvStreamShare kv_stream_share(const KvCacheWork& w, int u) {
  const int begin = u * w.stream_tile_blocks;
  const int first = kv_stream_cta(w, begin);
  return {first, kv_stream_cta(w, begin + w.stream_tile_blocks - 1) - first + 1};
}
// Whether any tile is cut among CTAs (the combine is needed): unless every CTA's range is the
// same whole number of tiles.
WARPATTN_HOST_DEVICE bool kv_stream_cuts_tiles(const KvCacheWork& w) {
  return w.stream_blocks % w.stream_ctas != 0 || w.stream_blocks / w.stream_ctas % w.stream_tile_blocks != 0;
}
// The most CTAs any tile is cut among (KvCacheWork::stream_slots): a tile spans at most
// ceil(tile_blocks / shortest range) ranges, and one more where it starts inside one.
WARPATTN_HOST_DEVICE int kv_stream_slots(int blocks, int ctas, int tile_blocks) {
  const int shortest = blocks / ctas;  // (>= 1: stream-K only where blocks >= ctas)
  const int n = (tile_blocks + shortest - 1) / shortest + 1;
  return n < ctas ? n : ctas;
}
// Fragment j of CTA cta: its tile, the tile's key blocks [begin, end), and its partial state's
// slot (-1: the whole tile in this one CTA). valid false past the CTA's range.
struct KvStreamFragment {
  bool valid;
  int tile, begin, end, slot;
};
WARPATTN_HOST_DEVICE KvStreamFragment kv_stream_fragment(const KvCacheWork& w, int cta, int j) {
  const int lo = kv_stream_begin(w, cta), hi = kv_stream_begin(w, cta + 1), tb = w.stream_tile_blocks;
  const int u = lo / tb + j;
  const int start = j == 0 ? lo : u * tb;
  if (start >= hi) return {false, 0, 0, 0, -1};
  const int end = hi < (u + 1) * tb ? hi : (u + 1) * tb;
  // Whole: the fragment is the tile (kv_stream_share's count 1). Otherwise its state's index
  // among the tile's is this CTA's among those sharing it: 0 where the tile starts here.
  const bool starts_here = start == u * tb;
  if (starts_here && end == (u + 1) * tb) return {true, u, 0, tb, -1};
  const int k = starts_here ? 0 : cta - kv_stream_cta(w, u * tb);
  return {true, u, start - u * tb, end - u * tb, u * w.stream_slots + k};
}
// Fragment j of CTA cta as a piece: its tile's coordinates and key tiles (those of [begin, end)
// below the sequence's own keys: a short sequence's fragments past them are empty), and its slot.
struct KvStreamPiece {
  KvCachePiece piece;
  int slot;
  bool valid;
};
WARPATTN_HOST_DEVICE KvStreamPiece kv_stream_piece(int cta, int j, const KvCacheWork& w, const TileGrid& grid,
                                                   int positions, int block_n, int seqlen_q) {
  const KvStreamFragment f = kv_stream_fragment(w, cta, j);
  if (!f.valid) return {{}, -1, false};
  const WorkTile t = tile_coords(f.tile, grid);
  const int seqlen_k = kv_cache_keys(w, t.batch);
  const KeyTileRange r = kv_tile_range(t.m_block, positions, block_n, seqlen_q, seqlen_k, KeyBand{});
  const int blocks = r.count(), end = f.end < blocks ? f.end : blocks;
  return {{t, end > f.begin ? end - f.begin : 0, r.begin + end, seqlen_k}, f.slot, true};
}

}  // namespace warpattn::detail
