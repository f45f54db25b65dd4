// Named-barrier ids of the forward kernel (0 is __syncthreads, used only before the roles
// split).
#pragma once

namespace warpattn::detail {

struct Barrier {
  // Ping-pong: consumer warpgroup i waits on kTurn0 + i before issuing its GEMMs, and hands
  // the turn to the other one right after issuing them (count 256: 128 sync + 128 arrive).
  static constexpr int kTurn0 = 1;
  // Epilogue: the 128 threads of one consumer warpgroup, before its O tile is stored.
  static constexpr int kEpilogue0 = 3;
};

}  // namespace warpattn::detail
