// Score masking for the key tiles that need it (kv_tile_needs_mask): keys past seqlen_k and,
// for causal attention, keys right of the bottom-right-aligned diagonal become -inf.
#pragma once

#include <cmath>

#include "hopper/fragment.cuh"

namespace warpattn::detail {

// s: one thread's slice of a 64 x kBlockN score tile. row0: global query row of register
// half 0; key0: global key index of the tile's first column.
template <bool kCausal, int kRegs>
__device__ __forceinline__ void mask_scores(float (&s)[kRegs], const FragmentCoords& f, int row0,
                                            int key0, int seqlen_q, int seqlen_k) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int limit = seqlen_k;  // first key index this row may not see
    if constexpr (kCausal) {
      const int diagonal = row0 + 8 * r + seqlen_k - seqlen_q + 1;
      limit = diagonal < limit ? diagonal : limit;
    }
    limit -= key0;
#pragma unroll
    for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        if (f.col(j, c) >= limit) s[4 * j + 2 * r + c] = -INFINITY;
  }
}

}  // namespace warpattn::detail
