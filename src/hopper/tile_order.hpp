// The order of the work tiles (one 128-row query block of one (batch, head) each).
// (batch, head) pairs are taken in chunks whose K and V fit in L2 together and whose query
// blocks one wave of CTAs covers (chunk_heads), so the CTAs running at one time share
// key/value tiles through L2; inside a chunk the last query
// blocks come first: under a causal mask they see the most keys, so long tiles start early and
// short ones fill in at the end instead of forming a tail.
#pragma once

#include "hopper/forward_params.hpp"
#include "hopper/host_device.hpp"

namespace warpattn::detail {

struct WorkTile {
  int m_block, head, batch;
};

// The tiles of one launch (dense), or of one sequence of a packed batch (batch 1).
struct TileGrid {
  int m_blocks, heads_q, batch, chunk_heads;
};

WARPATTN_HOST_DEVICE int total_tiles(const ForwardParams& p) { return p.m_blocks * p.heads_q * p.batch; }

WARPATTN_HOST_DEVICE WorkTile tile_coords(int tile, const TileGrid& p) {
  const int heads_batches = p.heads_q * p.batch;
  const int per_chunk = p.chunk_heads * p.m_blocks;
  const int chunk = tile / per_chunk;
  const int first = chunk * p.chunk_heads;
  const int left = heads_batches - first;
  const int heads_here = p.chunk_heads < left ? p.chunk_heads : left;
  const int i = tile - chunk * per_chunk;
  const int hb = first + i % heads_here;
  return {p.m_blocks - 1 - i / heads_here, hb % p.heads_q, hb / p.heads_q};
}

WARPATTN_HOST_DEVICE WorkTile tile_coords(int tile, const ForwardParams& p) {
  return tile_coords(tile, TileGrid{p.m_blocks, p.heads_q, p.batch, p.chunk_heads});
}

// How many (batch, head) pairs a chunk takes: half of L2 for their K and V (query heads of one
// GQA group share theirs), and no more pairs than one wave of CTAs covers, so each pair's K/V
// is read by all of its query blocks at about the same time (run 18: +4-10% at N <= 1024
// non-causal). kv_bytes_per_query_head: 2 x seqlen_k x head_dim x element bytes / kv_group.
WARPATTN_HOST_DEVICE int chunk_heads_for(long long kv_bytes_per_query_head, int m_blocks, int heads_batches,
                                         long long l2_bytes, int multiprocessors) {
  const long long per_head = kv_bytes_per_query_head > 0 ? kv_bytes_per_query_head : 1;
  long long chunk = l2_bytes / 2 / per_head;
  const long long wave = (multiprocessors + m_blocks - 1) / m_blocks;
  chunk = chunk < wave ? chunk : wave;
  chunk = chunk < heads_batches ? chunk : heads_batches;
  return chunk < 1 ? 1 : static_cast<int>(chunk);
}

}  // namespace warpattn::detail
