// The tile scheduler: CTAs walk the work tiles (one 128-row query block of one (batch, head)
// each) in rounds of gridDim.x tiles, snaking: in even rounds CTA c takes the round's c-th
// tile, in odd rounds its (gridDim.x - 1 - c)-th. Tiles come longest first (below), so over
// two rounds every CTA gets about the same amount of work.
// Tile order: (batch, head) pairs are taken in chunks whose K and V fit in L2 together
// (chunk_heads), so the CTAs running at one time share key/value tiles through L2; inside a
// chunk the last query blocks come first: under a causal mask they see the most keys, so long
// tiles start early and short ones fill in at the end instead of forming a tail.
#pragma once

#include "hopper/forward_params.hpp"

namespace warpattn::detail {

struct WorkTile {
  int m_block, head, batch;
};

struct TileScheduler {
  int round = 0;
  int tile;
  int total;
  __device__ __forceinline__ explicit TileScheduler(const ForwardParams& p)
      : tile(static_cast<int>(blockIdx.x)), total(p.m_blocks * p.heads_q * p.batch) {}
  __device__ __forceinline__ bool valid() const { return tile < total; }
  __device__ __forceinline__ void advance() {
    ++round;
    const int g = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
    tile = round * g + ((round & 1) ? g - 1 - c : c);
  }
  __device__ __forceinline__ WorkTile current(const ForwardParams& p) const {
    const int heads_batches = p.heads_q * p.batch;
    const int per_chunk = p.chunk_heads * p.m_blocks;
    const int chunk = tile / per_chunk;
    const int first = chunk * p.chunk_heads;
    const int heads_here = min(p.chunk_heads, heads_batches - first);
    const int i = tile - chunk * per_chunk;
    const int hb = first + i % heads_here;
    return {p.m_blocks - 1 - i / heads_here, hb % p.heads_q, hb / p.heads_q};
  }
};

}  // namespace warpattn::detail
