// The persistent tile scheduler: one CTA per SM walks the work tiles (one 128-row query block
// of one (batch, head) each) with a static stride. The tile order puts the last query blocks
// first: under a causal mask they see the most keys, so every CTA starts with long tiles and
// the short ones fill in at the end instead of forming a tail.
#pragma once

#include "hopper/forward_params.hpp"

namespace warpattn::detail {

struct WorkTile {
  int m_block, head, batch;
};

struct TileScheduler {
  int tile;
  int total;
  __device__ __forceinline__ explicit TileScheduler(const ForwardParams& p)
      : tile(static_cast<int>(blockIdx.x)), total(p.m_blocks * p.heads_q * p.batch) {}
  __device__ __forceinline__ bool valid() const { return tile < total; }
  __device__ __forceinline__ void advance() { tile += static_cast<int>(gridDim.x); }
  __device__ __forceinline__ WorkTile current(const ForwardParams& p) const {
    const int heads_batches = p.heads_q * p.batch;
    const int hb = tile % heads_batches;
    return {p.m_blocks - 1 - tile / heads_batches, hb % p.heads_q, hb / p.heads_q};
  }
};

}  // namespace warpattn::detail
