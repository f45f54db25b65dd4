// The split tail of a persistent launch (stream-K for the last wave). With T work tiles on
// G CTAs, T mod G tiles are left for a last wave in which the other CTAs would idle: 1024
// tiles on 132 SMs (d = 256, 16k tokens, 8 heads) run as 8 waves where 7.76 would do.
// Instead the first T - T mod G tiles go out whole, and the key tiles of the remaining ones
// (the tail: its tiles in a row, each tile's key tiles in a row) are cut into G equal
// ranges, one per CTA. A range covers the end of one tail tile and the start of the next at
// most (it is shorter than a tile). Each CTA leaves the partial softmax state of its pieces
// (O unnormalised, row references and sums) in a workspace, and combine_split_tail_kernel
// adds each tile's pieces in CTA order (the same sums every launch) and writes the output
// (split_tail_combine.cuh).
// Only non-causal launches split (every tile has the same key tiles). Run 59: under the
// 700 W cap the idle SMs of a last wave let the busy ones clock higher, so the split gains
// less than the waves suggest: +1-2% at 16k tokens (BF16 d = 256, FP8 / INT8 d = 128), 0 at
// FP8 d = 256; a tail of one-key-tile ranges (d = 64, N = 1024) lost 4% to the stores, the
// second launch and the pieces' own ramp. Functions shared with the CPU tests.
#pragma once
#include <cstdint>

#include "hopper/host_device.hpp"

namespace warpattn::detail {

struct SplitTail {
  int first_tile = 0;  // work tiles before it go out whole
  int tiles = 0;       // tail tiles (0: nothing is split)
  int kv_tiles = 0;    // key tiles of each work tile
  int ctas = 1;        // the grid

  // 32-bit arithmetic: plan_split_tail keeps steps() x (ctas + 1) below 2^31 (a 64-bit
  // division is a call, and the producer that divides here has 24-40 registers).
  WARPATTN_HOST_DEVICE int steps() const { return tiles * kv_tiles; }
  // First step (tail tile t's key tile j is step t kv_tiles + j) of CTA c's range; c = ctas is
  // the end of the last range.
  WARPATTN_HOST_DEVICE int begin(int c) const { return c * steps() / ctas; }
  // The CTA whose range holds step x (the largest c with begin(c) <= x).
  WARPATTN_HOST_DEVICE int cta_of_step(int x) const { return ((x + 1) * ctas + steps() - 1) / steps() - 1; }
  WARPATTN_HOST_DEVICE int first_cta(int tile) const { return cta_of_step(tile * kv_tiles); }
  WARPATTN_HOST_DEVICE int last_cta(int tile) const { return cta_of_step((tile + 1) * kv_tiles - 1); }
  // With fewer steps than CTAs some ranges are empty (a CTA between a tile's first and last
  // may have none): those store nothing and are skipped.
  WARPATTN_HOST_DEVICE bool has_range(int c) const { return begin(c) < begin(c + 1); }
  // Where CTA c stores its partial state of tail tile `tile`: two slots per CTA, for the tile
  // its range starts in and the one it ends in.
  WARPATTN_HOST_DEVICE int slot(int c, int tile) const {
    return 2 * c + (begin(c) / kv_tiles == tile ? 0 : 1);
  }

  // The tail tile of CTA c's piece whose key tiles start at kv_begin: a range starts inside
  // its first tile, so a piece from key tile 0 where the range does not start on a tile
  // boundary is the second one (a consumer knows its piece by its key tiles alone).
  WARPATTN_HOST_DEVICE int tile_of_piece(int c, int kv_begin) const {
    const int b = begin(c);
    return b / kv_tiles + (kv_begin == 0 && b % kv_tiles != 0);
  }

  struct Piece {
    int tile;              // tail tile
    int kv_begin, kv_end;  // its key tiles [kv_begin, kv_end)
  };
  // Piece i (0 or 1) of CTA c; false when the range has no such piece.
  WARPATTN_HOST_DEVICE bool piece(int c, int i, Piece& out) const {
    const int b = begin(c), e = begin(c + 1);
    const int t = b / kv_tiles + i;
    const int lo = b > t * kv_tiles ? b : t * kv_tiles;
    const int hi = e < (t + 1) * kv_tiles ? e : (t + 1) * kv_tiles;
    if (i > 1 || lo >= hi) return false;
    out = {t, lo - t * kv_tiles, hi - t * kv_tiles};
    return true;
  }
};

// The split of `total` work tiles of `kv_tiles` key tiles each over `ctas` CTAs: a tail only
// when its ranges are shorter than a whole tile by at least min_saved key tiles (so a range
// never spans more than two tiles, and the saving pays for the stores and the combine).
WARPATTN_HOST_DEVICE SplitTail plan_split_tail(int total, int kv_tiles, int ctas, int min_saved) {
  SplitTail s;
  s.kv_tiles = kv_tiles;
  s.ctas = ctas;
  const int tail = total % ctas;
  if (total <= ctas || tail == 0 || kv_tiles < 2) {
    s.first_tile = total;
    return s;
  }
  const int64_t steps = static_cast<int64_t>(tail) * kv_tiles;
  const int64_t range = (steps + ctas - 1) / ctas;  // the longest
  if (range + min_saved > kv_tiles || steps * (ctas + 1) >= (int64_t{1} << 31)) {
    s.first_tile = total;
    return s;
  }
  s.first_tile = total - tail;
  s.tiles = tail;
  return s;
}

}  // namespace warpattn::detail
