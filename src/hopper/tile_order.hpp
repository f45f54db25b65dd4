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

WARPATTN_HOST_DEVICE int total_tiles(const ForwardParams& p) { return p.m_blocks * p.heads_q * p.batch; }

WARPATTN_HOST_DEVICE WorkTile tile_coords(int tile, const ForwardParams& p) {
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

}  // namespace warpattn::detail
