// The tile scheduler of the persistent grid: which CTA takes which work tile (the order of
// the tiles is tile_order.hpp's).
//
// Assignment: CTA c starts with tile c. Then, with a tile counter (dynamic), the producer
// takes the next free tile with one atomicAdd, so a CTA that finishes early takes more
// (greedy, like the hardware's block scheduler); the counter resets itself when the last CTA
// is done, ready for the next launch on that stream. Without one (static), CTAs walk rounds of
// gridDim.x tiles, snaking (CTA c takes the round's c-th tile in even rounds and its
// (gridDim.x - 1 - c)-th in odd rounds), which evens out the longest-first order over two
// rounds.
//
// The producer chooses each tile and publishes it to the consumers through a two-slot ring
// in shared memory (TileSlots); an index >= total ends the CTA's work.
#pragma once

#include "hopper/forward_params.hpp"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/tile_order.hpp"

namespace warpattn::detail {

// The producer's side: which tile comes next.
struct TileChooser {
  int round = 0;
  int tile = static_cast<int>(blockIdx.x);

  __device__ __forceinline__ void advance(const ForwardParams& p) {
    const int g = static_cast<int>(gridDim.x);
    if (p.tile_counter != nullptr) {
      tile = g + atomicAdd(p.tile_counter, 1);
      if (tile >= total_tiles(p)) {
        // Every CTA stops fetching once it draws past the end; the last one to stop resets
        // the counter for the next launch.
        __threadfence();
        if (atomicAdd(p.tile_counter + 1, 1) == g - 1) {
          p.tile_counter[0] = 0;
          p.tile_counter[1] = 0;
        }
      }
    } else {
      ++round;
      const int c = static_cast<int>(blockIdx.x);
      tile = round * g + ((round & 1) ? g - 1 - c : c);
    }
  }
};

// Two slots of tile indices from the producer to the consumer warpgroups.
struct TileSlots {
  int index[2];
  uint64_t full[2];   // count 1: the producer's arrival
  uint64_t empty[2];  // count 256: every consumer thread has read it

  __device__ __forceinline__ void init() {
    for (int s = 0; s < 2; ++s) {
      ptx::mbarrier_init(ptx::smem_addr(&full[s]), 1);
      ptx::mbarrier_init(ptx::smem_addr(&empty[s]), 256);
    }
  }
  // i: how many tiles this CTA has published before.
  __device__ __forceinline__ void publish(int i, int tile) {
    const int s = i & 1;
    ptx::mbarrier_wait(ptx::smem_addr(&empty[s]), ((i >> 1) & 1) ^ 1);
    index[s] = tile;
    ptx::mbarrier_arrive(ptx::smem_addr(&full[s]));  // release: orders the store above
  }
  __device__ __forceinline__ int receive(int i) {
    const int s = i & 1;
    ptx::mbarrier_wait(ptx::smem_addr(&full[s]), (i >> 1) & 1);
    const int tile = *static_cast<volatile int*>(&index[s]);
    ptx::mbarrier_arrive(ptx::smem_addr(&empty[s]));
    return tile;
  }
};

}  // namespace warpattn::detail
