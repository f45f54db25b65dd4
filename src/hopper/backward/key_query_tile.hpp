// The backward's [key][query] tiles in shared memory (dSᵀ where dQ is not transposed: d = 64,
// and d = 128 with 64-row query blocks): one row of 128 bytes (64 16-bit queries) per key,
// 64-query panels block_n x 128 bytes apart, 128B-swizzled on a 1024-byte-aligned base: the
// 16-byte chunk of 8-query group g of key row k sits at chunk (g % 8) ^ (k % 8). That is
// the layout the descriptors read as a TMA tile's: K-major with the keys as M (dV += Pᵀ·dO,
// dK += dSᵀ·Q) and MN-major with the queries as M (dQ = dS·K).
//
// A consumer writes its 16-bit operand registers (accumulator_to_operand of an m64nN
// accumulator whose N axis is the step's N queries) with one 32-bit store each: register i of
// k16 step kk holds rows f.row(i % 2) and queries 16 kk + 8 (i / 2) + 2 quad, + 1
// (fragment.cuh).
#pragma once

#include <cstdint>

#include "hopper/host_device.hpp"

namespace warpattn::detail {

// The 8-query group (of the step's) that operand register i of k16 step kk holds.
WARPATTN_HOST_DEVICE constexpr int operand_query_group(int kk, int i) { return 2 * kk + i / 2; }

// Where in the tile at `tile` the 32-bit pair (queries 8 group + 2 quad, + 1) of key row `key`
// lies. (The terms are added to the pointer one by one, as the kernels always did: summing them
// as an int first changes the address code ptxas makes.)
WARPATTN_HOST_DEVICE uint8_t* key_query_tile_pair(uint8_t* tile, int key, int group, int quad, int block_n) {
  return tile + (group / 8) * block_n * 128 + key * 128 + ((group % 8) ^ (key % 8)) * 16 + quad * 4;
}

}  // namespace warpattn::detail
