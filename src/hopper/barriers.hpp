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
};

}  // namespace warpattn::detail
