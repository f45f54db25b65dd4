// The backward's [key][query] tiles (hopper/backward/key_query_tile.hpp) against the layout the
// WGMMA descriptors read, for every way the consumers write them: dSᵀ by each consumer for its
// keys at d = 128 (64-row query blocks) and d = 64. (d = 256 writes its 80-key tiles by
// stmatrix: test_block_n80_layout.cpp.)
//
// The registers a thread writes are modelled from the PTX fragment rules (fragment.cuh,
// HOPPER-PRIMER.md §5): thread t = 32 w + 4 g + q holds accumulator register 4j + 2r + c at
// row 16 w + g + 8 r, column 8 j + 2 q + c; accumulator_to_operand packs registers
// 8 kk + 2 i, + 1 into operand register i of k16 step kk. The read side is the 128B-swizzled
// canonical layout (HOPPER-PRIMER.md §4.4, 4.5): a K-major operand with rows of 128 bytes
// (SBO 1024) whose k16 step kk starts 32 kk bytes in, the swizzle XORing address bits 4-6
// with bits 7-9 of the (1024-aligned) tile offset.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "harness.hpp"
#include "hopper/backward/key_query_tile.hpp"

using warpattn::detail::key_query_tile_pair;
using warpattn::detail::operand_query_group;

namespace {

// Byte offset of element (m, k) of a K-major, 128B-swizzled operand with 64-element rows, as
// the descriptor of its k16 step k / 16 reads it (start 32 (k / 16) bytes past the tile).
int kmajor_read_offset(int m, int k) {
  const int start = 32 * (k / 16);
  const int logical = (m / 8) * 1024 + (m % 8) * 128 + start + 2 * (k % 16);
  return logical ^ (((logical >> 7) & 7) << 4);
}

struct Writer {       // one consumer's writes of one tile
  int key_base;       // its first key row in the tile
  int queries;        // columns of its accumulator (the N of its m64nN), from the step's first
};

// Writes every writer's registers (each element tagged with its (key, query)) into a tile of
// block_n keys by block_m queries, and checks: every 16-bit element written exactly once, with
// the element the K-major read (keys as M, queries as K, per 64-query panel) expects there,
// and no bank conflict within a warp's store.
int check_tile(const char* what, int block_n, int block_m, const std::vector<Writer>& writers) {
  const int bytes = block_n * block_m * 2;
  std::vector<uint8_t> tile(bytes);
  std::vector<int> owner(bytes / 2, -1);  // key * block_m + query per 16-bit element
  int bad = 0;
  auto fail = [&](const char* why, int key, int query) {
    if (bad++ < 5) std::printf("    %s: %s at key %d query %d\n", what, why, key, query);
  };
  for (const Writer& wr : writers)
    for (int warp = 0; warp < 4; ++warp)
      for (int kk = 0; kk < wr.queries / 16; ++kk)
        for (int i = 0; i < 4; ++i) {
          int lane_bank[32];
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, q = lane % 4;
            const int key = wr.key_base + 16 * warp + g + 8 * (i % 2);  // row of register half i % 2
            const int group = operand_query_group(kk, i);
            const int query = 8 * group + 2 * q;  // and query + 1 in the high half
            // the model of the fragment: operand register i of step kk = accumulator
            // registers 8 kk + 2 i, + 1 = j = 2 kk + i / 2, r = i % 2, c = 0, 1
            if (query != 8 * (2 * kk + i / 2) + 2 * q) fail("group", key, query);
            const int offset = static_cast<int>(key_query_tile_pair(tile.data(), key, group, q, block_n) - tile.data());
            if (offset < 0 || offset + 4 > bytes || offset % 4 != 0) {
              fail("outside the tile", key, query);
              continue;
            }
            lane_bank[lane] = (offset / 4) % 32;
            for (int c = 0; c < 2; ++c) {
              int& o = owner[offset / 2 + c];
              if (o >= 0) fail("written twice", key, query + c);
              o = key * block_m + query + c;
            }
          }
          for (int a = 0; a < 32; ++a)
            for (int b = a + 1; b < 32; ++b)
              if (lane_bank[a] == lane_bank[b]) fail("bank conflict", wr.key_base + 16 * warp, 0);
        }
  // The read side: element (key, query) of 64-query panel query / 64, read K-major as
  // A[key][query % 64], must hold what the writers put there.
  for (int key = 0; key < block_n; ++key)
    for (int query = 0; query < block_m; ++query) {
      const int offset = (query / 64) * block_n * 128 + kmajor_read_offset(key, query % 64);
      const int got = owner[offset / 2];
      if (got != key * block_m + query) fail(got < 0 ? "never written" : "another element read", key, query);
    }
  return bad;
}

}  // namespace

// d = 128 with 64-row query blocks (WARPATTN_TUNE_BWD_BLOCK_M = 64): 128 keys, consumer c its
// 64 from 64 c, all 64 queries.
TEST(key_query_tile_d128) { CHECK(check_tile("d=128", 128, 64, {{0, 64}, {64, 64}}) == 0); }

// d = 64: 128 keys by 128 queries (two 64-query panels), consumer c its 64 keys.
TEST(key_query_tile_d64) { CHECK(check_tile("d=64", 128, 128, {{0, 128}, {64, 128}}) == 0); }
