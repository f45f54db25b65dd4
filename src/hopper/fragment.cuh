// Where a thread's registers sit in a wgmma m64nN f32 accumulator (PTX "Register Fragments"):
// thread t of the warpgroup holds d[4j + 2r + c] = D[16 w + g + 8 r][8 j + 2 q + c] with
// w = warp, g = lane / 4, q = lane % 4. A row is shared by the 4 lanes of a quad.
#pragma once
#include <cstdint>

namespace warpattn::detail {

struct FragmentCoords {
  int warp, group, quad;
  __device__ __forceinline__ explicit FragmentCoords(int thread_in_warpgroup)
      : warp(thread_in_warpgroup / 32),
        group((thread_in_warpgroup % 32) / 4),
        quad(thread_in_warpgroup % 4) {}
  // Row (within the warpgroup's 64) of register half r = 0, 1.
  __device__ __forceinline__ int row(int r) const { return 16 * warp + group + 8 * r; }
  // Column of register d[4 j + 2 r + c].
  __device__ __forceinline__ int col(int j, int c) const { return 8 * j + 2 * quad + c; }
};

// Reductions across the quad that shares a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Reductions across the 8 lanes that share a column (the same quad position in every group):
// an accumulator's column over the warp's 16 rows, with the max or sum of a thread's two halves
// taken first (the few-row tile's keys lie on the rows).
__device__ __forceinline__ float column_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

// A 4 x 4 transpose across the quad: afterwards lane q's x[k] is what lane k's x[q] was.
// Two butterfly rounds (lane bit 0, then bit 1); in each, a lane swaps with its partner the
// two entries whose index bit differs from its own lane bit.
__device__ __forceinline__ void quad_transpose(uint32_t (&x)[4], int quad) {
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    const int bit = 1 << b;
    const bool upper = (quad & bit) != 0;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int k0 = b == 0 ? 2 * m : m;  // bit b clear, the other index bit = m
      const int k1 = k0 | bit;
      const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? x[k0] : x[k1], bit);
      if (upper)
        x[k0] = got;
      else
        x[k1] = got;
    }
  }
}

}  // namespace warpattn::detail
