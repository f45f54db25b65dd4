// Named-barrier ids of the forward kernel (0 is __syncthreads, used only before the roles
// split).
#pragma once

namespace warpattn::detail {

struct Barrier {
  // Ping-pong: consumer warpgroup i waits on kTurn0 + i before issuing its GEMMs, and hands
  // the turn to the next one right after issuing them (count 256: 128 sync + 128 arrive).
  // Ids kTurn0 .. kTurn0 + 2 with three consumer warpgroups.
  static constexpr int kTurn0 = 1;
  // The split head dim (split_head_dim.cuh): both warpgroups have written their partial S, and
  // both have read the other's (before either writes the next tile's). Count 256.
  static constexpr int kExchangeWritten = 4, kExchangeRead = 5;
  // A KV cache's few-row tile (decode/few_rows_tile.cuh): warpgroup w's own barrier (count 128:
  // its max exchange, its Pᵀ written) at kFewRows0 + w, and both warpgroups' merge (count 256).
  static constexpr int kFewRows0 = 6, kFewRowsMerge = 8;
};

}  // namespace warpattn::detail
