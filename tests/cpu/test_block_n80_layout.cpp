// The d = 256 backward's 80-key tile (hopper/backward/block_n80_layout.hpp and
// backward_consumer_n80.cuh) on the CPU:
//   1. the P and dS tile writes: both consumers' m64n40 accumulators through stmatrix.trans
//      (x4, x4, x2 a warp) cover the 80 x 64 [key][query] tile once, each element where the
//      descriptors read it (K-major with the keys as rows: dVᵀ's and dKᵀ's B; the same bytes
//      MN-major with the queries as M: dQ's A), and no stmatrix matrix has a bank conflict;
//   2. a 32-column dQ piece (d[0 .. 15] or d[16 .. 31] of an m64n64 dQ GEMM's accumulator,
//      stored in register order) is the first or second half of the 64 x 64 piece of
//      dq_accum.cuh's layout, so the writer's offset (half x 2048 floats) and the conversion
//      kernel agree;
//   3. the epilogue's movmatrix.trans pairs cover each slice's 80 keys x 64 columns once, each
//      pair the accumulator's element transposed.
// The fragments are modelled from the PTX rules (HOPPER-PRIMER.md sections 5, 8.1):
// accumulator_coord for wgmma's registers; stmatrix / movmatrix: register i of lane l holds
// matrix i's (row l / 4, columns 2 (l % 4), + 1), .trans stores column k of the matrix as row k,
// whose address lane 8i + k gives.
#include <cstdio>
#include <vector>

#include "harness.hpp"
#include "hopper/backward/block_n80_layout.hpp"
#include "hopper/backward/dq_transposed_layout.hpp"

using warpattn::detail::accumulator_coord;
using warpattn::detail::AccumulatorCoord;
using L = warpattn::detail::BlockN80Layout;

namespace {

// Byte offset of (key, query) in a [key][query] tile of 64-query rows, 128B-swizzled on a
// 1024-aligned base, as a K-major descriptor (rows = keys, SBO 1024, k16 step kk 32 kk bytes in)
// reads it; an MN-major one (M = queries, K = keys, +2048 bytes per 16 keys) reads the same
// address: (key / 8) 1024 + (key % 8) 128 + 2 query before the swizzle either way.
int tile_read_offset(int key, int query) {
  const int logical = (key / 8) * 1024 + (key % 8) * 128 + 2 * query;
  return logical ^ (((logical >> 7) & 7) << 4);
}

}  // namespace

TEST(block_n80_pds_tile_writes) {
  std::vector<int> owner(L::kKeys * L::kQueries, -1);  // key * 64 + query at each 16-bit slot
  int bad = 0;
  auto fail = [&](const char* why, int c, int w, int call, int mat) {
    if (bad++ < 5) std::printf("    %s: consumer %d warp %d call %d matrix %d\n", why, c, w, call, mat);
  };
  for (int c = 0; c < 2; ++c)
    for (int w = 0; w < 4; ++w)
      for (int call = 0; call < L::kStores; ++call)
        for (int mat = 0; mat < L::matrices(call); ++mat) {
          int row_bank_group[8];
          for (int k = 0; k < 8; ++k) {  // stored row k of the matrix: lane 8 mat + k's address
            const int row = L::row_offset(c, w, 8 * mat + k, call);
            if (row % 16 != 0 || row < 0 || row + 16 > L::kKeys * 128) fail("row address", c, w, call, mat);
            row_bank_group[k] = row / 16 % 8;  // 4 banks of 4 bytes per 16-byte row segment
          }
          for (int a = 0; a < 8; ++a)
            for (int b = a + 1; b < 8; ++b)
              if (row_bank_group[a] == row_bank_group[b]) fail("bank conflict", c, w, call, mat);
          for (int lane = 0; lane < 32; ++lane)
            for (int e = 0; e < 2; ++e) {
              // lane's register for the matrix packs accumulator registers first_register, + 1
              const AccumulatorCoord a = accumulator_coord(32 * w + lane, L::first_register(call, mat) + e);
              const int query = a.m, key = L::kConsumerKeys * c + a.n;
              const int mrow = lane / 4, mcol = 2 * (lane % 4) + e;  // in the 8x8 matrix
              // .trans: element (mrow, mcol) goes to stored row mcol, position mrow
              const int offset = L::row_offset(c, w, 8 * mat + mcol, call) + 2 * mrow;
              if (offset != tile_read_offset(key, query)) fail("not where the descriptors read it", c, w, call, mat);
              if (offset < 0 || offset >= L::kKeys * 128) continue;
              int& o = owner[offset / 2];
              if (o >= 0) fail("written twice", c, w, call, mat);
              o = key * L::kQueries + query;
            }
        }
  for (int key = 0; key < L::kKeys; ++key)
    for (int query = 0; query < L::kQueries; ++query)
      if (owner[tile_read_offset(key, query) / 2] != key * L::kQueries + query) {
        if (bad++ < 5) std::printf("    key %d query %d not written or another element read\n", key, query);
      }
  CHECK(bad == 0);
}

TEST(block_n80_dq_half_pieces) {
  int bad = 0;
  for (int half = 0; half < 2; ++half)
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < 16; ++i) {  // register i of the piece: d[16 half + i] of the m64n64 GEMM's
        const AccumulatorCoord a = accumulator_coord(t, 16 * half + i);
        // hand_over_dq_piece: d[4j .. 4j + 3] at floats 4 (128 j + t); the writer adds the
        // buffer at 2048 x half floats into the 64 x 64 piece
        const int f = 2048 * half + 4 * (128 * (i / 4) + t) + i % 4;
        // the 64 x 64 piece's float f holds register 4 (f / 512) + f % 4 of thread f / 4 % 128
        const AccumulatorCoord b = accumulator_coord(f / 4 % 128, 4 * (f / 512) + f % 4);
        if (b.m != a.m || b.n != a.n) {
          if (bad++ < 5) std::printf("    half %d thread %d register %d\n", half, t, i);
        }
      }
  CHECK(bad == 0);
}

TEST(block_n80_transposed_store_pairs) {
  std::vector<int> owner(L::kKeys * 64, -1);  // (key, column of the slice) per 16-bit element
  int bad = 0;
  for (int t = 0; t < 128; ++t)
    for (int j = 0; j < L::kKeys / 8; ++j)
      for (int r = 0; r < 2; ++r) {
        const L::KeyColumn kc = L::transposed_pair(t, j, r);
        // movmatrix.trans of the matrix (slice columns 16w + 8r .., keys 8j ..) whose lane l holds
        // accumulator registers 4j + 2r, + 1: lane t % 32 gets (row 2q + e, column g) of the source
        const int lane = t % 32, w = t / 32, g = lane / 4, q = lane % 4;
        for (int e = 0; e < 2; ++e) {
          const int src_lane = 4 * (2 * q + e) + g / 2;  // holds source row 2q + e, columns 2 (g / 2), + 1
          const AccumulatorCoord a = accumulator_coord(32 * w + src_lane, 4 * j + 2 * r + g % 2);
          if (a.m != kc.column + e || a.n != kc.key) {
            if (bad++ < 5) std::printf("    thread %d j %d r %d e %d\n", t, j, r, e);
          }
          int& o = owner[kc.key * 64 + kc.column + e];
          if (o >= 0 && bad++ < 5) std::printf("    key %d column %d twice\n", kc.key, kc.column + e);
          o = 1;
        }
      }
  for (int x : owner)
    if (x < 0) ++bad;
  CHECK(bad == 0);
}
