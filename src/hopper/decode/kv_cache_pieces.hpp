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

}  // namespace warpattn::detail
