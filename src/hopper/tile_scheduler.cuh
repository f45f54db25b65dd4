// The tile scheduler of the persistent grid: which CTA takes which work tile (the order of
// the tiles is tile_order.hpp's).
//
// Assignment: CTA c starts with tile c. Then, with a tile counter (dynamic), the producer
// takes the next free tile with one atomicAdd, so a CTA that finishes early takes more
// (greedy, like the hardware's block scheduler); the counter resets itself when the last CTA
// is done, ready for the next launch that uses it: never one that may run at the same time
// (scheduler_workspace.hpp). Without one (static), CTAs walk rounds of
// gridDim.x tiles, snaking (CTA c takes the round's c-th tile in even rounds and its
// (gridDim.x - 1 - c)-th in odd rounds), which evens out the longest-first order over two
// rounds.
//
// The producer chooses each tile and publishes it to the consumers, one tile ahead of its
// loads, through a two-slot ring in shared memory (TileSlots); an end marker ends the CTA's
// work.
#pragma once

#include "hopper/forward_params.hpp"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/tile_order.hpp"

namespace warpattn::detail {

// The producer's side: which tile comes next. Tiles before `whole` go out whole (dense
// non-causal: params.split.first_tile; causal: all of them; packed batches: the plan's count);
// once a CTA draws one at or past it, it takes the (at most two) pieces of its range of the
// split tail, then ends.
struct TileChooser {
  int round = 0;
  int tile = static_cast<int>(blockIdx.x);
  int piece = 0;  // in the tail: which piece of this CTA's range
  int whole;

  __device__ __forceinline__ explicit TileChooser(int whole_) : whole(whole_) {}

  // kSplits: false where the launch never splits (causal, packed batches): the tail's code is
  // left out.
  template <bool kSplits>
  __device__ __forceinline__ void advance(const ForwardParams& p) {
    const int g = static_cast<int>(gridDim.x);
    if (kSplits && tile >= whole) {
      ++piece;
    } else if (p.tile_counter != nullptr) {
      tile = g + atomicAdd(p.tile_counter, 1);
      if (tile >= whole) retire(p);
    } else {
      ++round;
      const int c = static_cast<int>(blockIdx.x);
      tile = round * g + ((round & 1) ? g - 1 - c : c);
    }
  }

  // Every CTA stops fetching once it draws past the whole tiles (or starts past them: a packed
  // batch's grid is sized before its tiles are counted); the last one to stop leaves the counter
  // zero for the next launch that uses it (scheduler_workspace.hpp).
  __device__ __forceinline__ void retire(const ForwardParams& p) const {
    __threadfence();
    if (atomicAdd(p.tile_counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
      p.tile_counter[0] = 0;
      p.tile_counter[1] = 0;
    }
  }
};

// A work tile as the producer hands it to the consumers: its coordinates and key-tile range
// worked out once, so the divisions of tile_coords stay off the consumers' path.
struct ScheduledTile {
  int m_block, head, batch;
  // Key tiles to visit: n_end - n_tiles .. n_end - 1 (n_tiles 0: every row of the block is
  // empty; a sliding window's tiles need not start at 0).
  int n_tiles, n_end;
  int piece;  // -1: a whole tile; 0 or 1: that piece of this CTA's range of the split tail
  // Packed batches only (dense: 0 and the launch's lengths, never read): the sequence's first
  // rows in the packed tensors and its lengths.
  int q_offset, seqlen_q, k_offset, seqlen_k;
  __device__ __forceinline__ bool is_end() const { return m_block < 0; }
};

// Two slots of scheduled tiles from the producer to the consumer warpgroups. The producer
// fills slot i + 1 while the consumers work on tile i - 1 or i, so they never wait for the
// tile counter's atomicAdd.
struct TileSlots {
  ScheduledTile tile[2];
  uint64_t full[2];   // count 1: the producer's arrival
  uint64_t empty[2];  // count: every consumer thread has read it

  __device__ __forceinline__ void init(int consumer_threads) {
    for (int s = 0; s < 2; ++s) {
      ptx::mbarrier_init(ptx::smem_addr(&full[s]), 1);
      ptx::mbarrier_init(ptx::smem_addr(&empty[s]), consumer_threads);
    }
  }
  // i: how many tiles this CTA has published before.
  __device__ __forceinline__ void publish(int i, const ScheduledTile& t) {
    const int s = i & 1;
    ptx::mbarrier_wait(ptx::smem_addr(&empty[s]), ((i >> 1) & 1) ^ 1);
    tile[s] = t;
    ptx::mbarrier_arrive(ptx::smem_addr(&full[s]));  // release: orders the stores above
  }
  // The tile the producer published as its i-th, read back by the producer itself (slot i & 1
  // is not published again before tile i + 2, which waits for the consumers to have read tile i).
  __device__ __forceinline__ ScheduledTile own(int i) const {
    const volatile ScheduledTile& v = tile[i & 1];
    ScheduledTile t;
    t.m_block = v.m_block, t.head = v.head, t.batch = v.batch, t.n_tiles = v.n_tiles, t.n_end = v.n_end;
    t.piece = v.piece, t.q_offset = v.q_offset, t.seqlen_q = v.seqlen_q, t.k_offset = v.k_offset;
    t.seqlen_k = v.seqlen_k;
    return t;
  }
  // kSplits: false where the launch never splits (causal, packed batches), so the piece field
  // is not read; kVarlen: the sequence's offsets and lengths are read.
  template <bool kSplits, bool kVarlen>
  __device__ __forceinline__ ScheduledTile receive(int i) {
    const int s = i & 1;
    ptx::mbarrier_wait(ptx::smem_addr(&full[s]), (i >> 1) & 1);
    const volatile ScheduledTile& v = tile[s];
    ScheduledTile t;
    t.m_block = v.m_block, t.head = v.head, t.batch = v.batch, t.n_tiles = v.n_tiles, t.n_end = v.n_end;
    t.piece = kSplits ? v.piece : -1;
    if constexpr (kVarlen) {
      t.q_offset = v.q_offset, t.seqlen_q = v.seqlen_q, t.seqlen_k = v.seqlen_k, t.k_offset = v.k_offset;
    } else {
      t.q_offset = 0, t.seqlen_q = 0, t.seqlen_k = 0, t.k_offset = 0;  // the consumers use the launch's
    }
    ptx::mbarrier_arrive(ptx::smem_addr(&empty[s]));
    return t;
  }
};

}  // namespace warpattn::detail
