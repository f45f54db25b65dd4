// A warpgroup's m64 x N 16-bit accumulator (its warps' 16-row slices, packed as
// accumulator_step_to_operand packs them) stored transposed: column n becomes stored row n, 128
// bytes (the 64 rows of the accumulator) in a 128B-swizzled tile as TMA writes K-major tiles
// (16-byte chunk c of row n at c ^ (n % 8)). The K-major operand that a transposed GEMM reads
// next: the backward's dS [query][key] for dQᵀ = Kᵀ·dSᵀ, the few-row tile's Pᵀ [row][key] for
// Oᵀ = Vᵀ·Pᵀ (decode/few_rows_tile.cuh).
#pragma once
#include <cstdint>

#include "hopper/fragment.cuh"
#include "hopper/ptx/math.cuh"
#include "hopper/ptx/stmatrix.cuh"

namespace warpattn::detail {

// One stmatrix.trans per 16 columns: step kk's four 8x8 matrices x[kk][0..3] are (rows g,
// columns 16kk + 2q ..), (rows g + 8, the same columns), (rows g, columns 16kk + 8 + 2q ..), (rows
// g + 8, those), each stored transposed, so stored row i of matrix mat is column 16kk + 8 (mat / 2)
// + i, its 16 bytes the warp's rows 16 warp + 8 (mat % 2) .. + 7: chunk 2 warp + mat % 2 of that
// row. Lane l gives row l % 8 of matrix l / 8. The 8 rows of a matrix are 8 rows of one swizzle
// atom: 8 different chunks, no bank conflict. tile: the stored rows' start (1024-aligned).
template <int kSteps>
__device__ __forceinline__ void store_transposed_rows(uint32_t tile, int warp, const uint32_t (&x)[kSteps][4]) {
  const int lane = threadIdx.x % 32, mat = lane / 8, row = lane % 8;
  const int chunk = (2 * warp + mat % 2) ^ row;  // (column % 8) = row: 16kk + 8 (mat / 2) is a multiple of 8
  const uint32_t addr = tile + (8 * (mat / 2) + row) * 128 + chunk * 16;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) ptx::stmatrix_x4_trans(addr + kk * 16 * 128, x[kk][0], x[kk][1], x[kk][2], x[kk][3]);
}

// The same for an E4M3 accumulator's values (kCols columns; P of an E4M3 KV cache's few-row
// tile) as bytes, in the layout of the cache's Vᵀ slices (decode/fp8_cache_layout.hpp) that the
// FP8 GEMM multiplies them with: warp w's 16 rows (keys) are slice w, kCols stored rows of 16
// bytes (no swizzle), the keys in kFp8KeyOrder. A thread holds keys g and g + 8 of its warp, which
// kFp8KeyOrder puts in word g / 2 of a stored row (bytes g % 2 and 2 + g % 2); the word's other two
// bytes are its partner's (lane ^ 4, group g ^ 1). So per 8 columns: one e4m3x4 pack, one shuffle,
// one 32-bit store (no stmatrix: it moves 16-bit elements); the even group stores column (j, 0),
// the odd one (j, 1). The 32 stores of a warp fill 128 contiguous bytes: no bank conflict.
template <int kCols>
__device__ __forceinline__ void store_transposed_rows_e4m3(uint8_t* slices, const FragmentCoords& f,
                                                           const float (&p)[kCols / 2]) {
  uint8_t* const slice = slices + f.warp * kCols * 16;
  const bool odd = f.group % 2;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    // bytes: (column (j, 0), key g), ((j, 0), g + 8), ((j, 1), g), ((j, 1), g + 8)
    const uint32_t mine = ptx::pack_e4m3x4(p[4 * j], p[4 * j + 2], p[4 * j + 1], p[4 * j + 3]);
    const uint32_t partner = __shfl_xor_sync(0xffffffffu, mine, 4);
    const uint32_t word = odd ? __byte_perm(mine, partner, 0x3726) : __byte_perm(mine, partner, 0x5140);
    *reinterpret_cast<uint32_t*>(slice + f.col(j, odd) * 16 + 4 * (f.group / 2)) = word;
  }
}

}  // namespace warpattn::detail
