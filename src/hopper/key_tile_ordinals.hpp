// Which key tiles of a work tile a consumer warpgroup visits (consumer.cuh): every one, or for
// a decode tile (KvCacheConfig's kDecodeTile, kAlternate here) those whose ring ordinal
// (kv_base + it: the tile's place in the K/V ring over the kernel's life) has the warpgroup's
// parity, warpgroup w the ring ordinals w, w + 2, ... On an even ring each stage then only ever
// holds one warpgroup's tiles, so a warpgroup's parity wait on a stage always follows its own
// release of the stage's previous tile, which has landed. Alternating within each tile broke
// that at tiles of an odd count, and 3 stages break it with any alternation: a warpgroup could
// wait on a stage whose previous tile, the other warpgroup's, was still in flight, one phase
// behind, and a parity wait on the phase after passes at once (run 142's decode benchmark
// faulted). tests/cpu/test_key_tile_ordinals.cpp checks both properties.
#pragma once

#include "hopper/host_device.hpp"

namespace warpattn::detail {

template <bool kAlternate>
struct KeyTileOrdinals {
  static constexpr int kStep = kAlternate ? 2 : 1;
  // The warpgroup's first ordinal in a tile whose first key tile has ring ordinal kv_base.
  static WARPATTN_HOST_DEVICE int first(int warpgroup, int kv_base) { return kAlternate ? (warpgroup + kv_base) & 1 : 0; }
  // Whether the warpgroup has any of n_tiles ordinals (of a one-tile decode tile, one has none).
  static WARPATTN_HOST_DEVICE bool any(int first, int n_tiles) { return first < n_tiles; }
  static WARPATTN_HOST_DEVICE int last(int first, int n_tiles) {
    return kAlternate ? n_tiles - 1 - ((n_tiles - 1 - first) & 1) : n_tiles - 1;
  }
  // The first of its ordinals at or past `from` (>= first).
  static WARPATTN_HOST_DEVICE int at_or_after(int first, int from) { return kAlternate ? from + ((from - first) & 1) : from; }
};

}  // namespace warpattn::detail
