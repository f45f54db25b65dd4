// Where the d = 256 backward's 80-key consumers (BackwardConfig::kBlockN80,
// backward_consumer_n80.cuh) put their registers: host-and-device, so the CPU tests
// (tests/cpu/test_block_n80_layout.cpp) check the kernel's addresses against the layouts the
// wgmma descriptors read.
//
// S = Q·Kᵀ and dP = dO·Vᵀ are m64n40 accumulators: consumer c's 40 keys 40c .. 40c + 39 of the
// CTA's 80 on N, the step's 64 queries on M. Thread t (warp w, lane l, g = l / 4, q = l % 4) holds
// d[4j + 2r + e] = (query 16w + g + 8r, key 40c + 8j + 2q + e), j = 0..4 (accumulator_coord).
// P and dS go to [key][query] tiles (key_query_tile.hpp with block_n = 80: one 64-query panel,
// 80 rows of 128 bytes, 128B-swizzled): K-major B of dVᵀ = dOᵀ·P and dKᵀ = Qᵀ·dS (N = keys,
// K = queries), MN-major A of dQ = dS·K (M = queries, K = keys). The pair d[4j + 2r], + 1 is
// the (row g, columns 2q, 2q + 1) fragment of the 8x8 matrix (queries 16w + 8r .., keys
// 40c + 8j ..); stmatrix.trans stores it transposed: its stored row k is key 40c + 8j + k, 16
// bytes of queries 16w + 8r .. + 7, which is chunk 2w + r of that key's row, swizzled with
// (key % 8) = k. Three stores a warp per tile: x4 over key groups 0-1, x4 over 2-3, x2 over 4.
#pragma once

#include "hopper/host_device.hpp"

namespace warpattn::detail {

struct BlockN80Layout {
  static constexpr int kKeys = 80, kQueries = 64, kConsumerKeys = 40;
  static constexpr int kStores = 3;  // stmatrix calls a warp per tile: x4, x4, x2

  // Matrices of call `call` (4, 4, 2).
  WARPATTN_HOST_DEVICE static constexpr int matrices(int call) { return call < 2 ? 4 : 2; }
  // The key group j (0..4, 8 keys each, of the consumer's 40) and query half r of matrix `mat`
  // (0..3) of call `call`: mat = r + 2 (j - 2 call), the stmatrix register order of
  // HOPPER-PRIMER.md section 12.
  WARPATTN_HOST_DEVICE static constexpr int key_group(int call, int mat) { return 2 * call + mat / 2; }
  WARPATTN_HOST_DEVICE static constexpr int query_half(int mat) { return mat % 2; }
  // The first of the two accumulator registers (d[i], d[i + 1]) packed into matrix mat's register.
  WARPATTN_HOST_DEVICE static constexpr int first_register(int call, int mat) {
    return 4 * key_group(call, mat) + 2 * query_half(mat);
  }
  // The byte offset in the tile of the row lane `lane` of warp `warp` of consumer `consumer`
  // gives to stmatrix call `call` (row lane % 8 of matrix lane / 8; an x2 reads lanes 0-15's).
  WARPATTN_HOST_DEVICE static constexpr int row_offset(int consumer, int warp, int lane, int call) {
    const int mat = lane / 8, row = lane % 8;
    const int key = kConsumerKeys * consumer + 8 * key_group(call, mat) + row;  // key % 8 = row
    return key * 128 + ((2 * warp + query_half(mat)) ^ row) * 16;
  }

  // The epilogue: dVᵀ and dKᵀ are, per consumer, two m64n80 accumulators (slice s: head-dim
  // columns 128 consumer + 64 s + m on M, the 80 keys on N). The pair d[4j + 2r], + 1 of thread t
  // is the (row g, columns 2q, + 1) fragment of the 8x8 matrix (columns 16w + 8r .., keys 8j ..);
  // movmatrix.trans gives the thread the transposed matrix's (row g, columns 2q, + 1): key 8j + g,
  // head-dim columns 16w + 8r + 2q and + 1 of the slice, one 4-byte pair of the dK or dV row.
  struct KeyColumn {
    int key, column;  // the key within the CTA's 80, the column within the slice's 64
  };
  WARPATTN_HOST_DEVICE static constexpr KeyColumn transposed_pair(int thread, int j, int r) {
    const int w = thread / 32, g = thread % 32 / 4, q = thread % 4;
    return {8 * j + g, 16 * w + 8 * r + 2 * q};
  }
};

}  // namespace warpattn::detail
