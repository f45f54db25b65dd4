// Score masking for the key tiles that need it (kv_tile_needs_mask): keys past seqlen_k and
// keys outside each row's band (kv_tiles.hpp: right of the causal diagonal or of a sliding
// window's right edge, left of a window's left edge) become -inf.
#pragma once

#include <cmath>

#include "hopper/fragment.cuh"
#include "hopper/kv_tiles.hpp"

namespace warpattn::detail {

// s: one thread's slice of a 64 x kBlockN score tile. row0: query row of register half 0 (in
// the sequence), the second's row0 + 8, or row1 where given (>= 0: a KV cache's packed rows,
// whose positions need not be 8 apart); key0: key index of the tile's first column. kBanded:
// the launch has a band (causal or a window); otherwise only seqlen_k bounds the keys.
// kLeftEdge: also the left edge of a window (ConsumerTile::run masks it only in the tiles that
// need it, after their P·V has completed: at d = 256 a bound per row does not fit beside O, P
// and S in flight).
// kThreadCols: the bounds taken relative to the thread's first column (f.col(0, 0)), so that
// each comparison is of a constant (f.col(j, c) - f.col(0, 0) = 8 j + c) against a register:
// without it ptxas may hold the thread's 64 column indices in registers across the comparisons
// of both rows, which at d = 256 beside O and S the E4M3 cache's consumers have not got.
template <bool kBanded, bool kLeftEdge, int kRegs, bool kThreadCols = false>
__device__ __forceinline__ void mask_scores(float (&s)[kRegs], const FragmentCoords& f, int row0, int key0,
                                            int seqlen_q, int seqlen_k, const KeyBand& band, int row1 = -1) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 1 && row1 >= 0 ? row1 : row0 + 8 * r;
    // The row's first column of this tile it may not see, and (left edge) the first it sees.
    const int from = kThreadCols ? key0 + f.col(0, 0) : key0;
    const int end = (kBanded ? band_key_end(row, seqlen_q, seqlen_k, band) : seqlen_k) - from;
    const int begin = kLeftEdge ? band_key_begin(row, seqlen_q, seqlen_k, band) - from : 0;
#pragma unroll
    for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = kThreadCols ? 8 * j + c : f.col(j, c);
        if (col >= end || (kLeftEdge && col < begin)) s[4 * j + 2 * r + c] = -INFINITY;
      }
  }
}

}  // namespace warpattn::detail
