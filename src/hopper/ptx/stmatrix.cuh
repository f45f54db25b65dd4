// stmatrix: a warp stores 8x8 matrices of 16-bit elements from mma-fragment registers to shared
// memory (PTX ISA "stmatrix"; HOPPER-PRIMER.md section 12: bit-exact with .trans, plain and
// 128-byte swizzled, on our H200).
#pragma once
#include <cstdint>

#include "hopper/ptx/arch_guard.cuh"

namespace warpattn::ptx {

// Four 8x8 matrices, each stored transposed. Register r_i of lane l holds matrix i's elements
// (row l / 4, columns 2 (l % 4) and + 1; the low half the even column), as a 16-bit mma or wgmma
// fragment does; lane l gives the shared address of stored row l % 8 of matrix l / 8 (16
// bytes). Transposed: stored row k of matrix i is its column k, so lane l's pair goes to
// stored rows 2 (l % 4) and + 1, position l / 4 of each.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// The same for two matrices (lanes 0-15 give the addresses; the others' are not read).
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

// An 8x8 matrix of 16-bit elements transposed across the warp, in registers (PTX ISA
// "movmatrix"): lane l's x holds (row l / 4, columns 2 (l % 4), + 1; the low half the even
// column); the result holds the same positions of the transposed matrix, i.e. (rows 2 (l % 4),
// + 1 of column l / 4).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

}  // namespace warpattn::ptx
