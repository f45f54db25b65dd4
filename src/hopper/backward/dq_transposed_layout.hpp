// Where the dQ pieces sit: the transposed ones (kernels whose query block, kQueries rows, is not
// a multiple of 64: Cfg::kDqTransposed) and the untransposed ones (the others). Host-and-device,
// so the CPU tests check the consumer's writing against the conversion kernel's reading
// (tests/cpu/test_dq_layout.cpp).
//
// Consumer c makes dQᵀ = Kᵀ·dSᵀ for columns 64c .. 64c + 63 of the step's kQueries rows: an
// m64n<kQueries> wgmma accumulator with the head dim on M and the queries on N. Thread t of the
// warpgroup holds d[4j + 2r + c'] = D[m][n] with m = 16 w + g + 8 r, n = 8 j + 2 q + c' (w = t / 32,
// g = t % 32 / 4, q = t % 4: HOPPER-PRIMER.md section 5.1), that is dQ[query n][column 64c + m].
//
// A piece (64 x kQueries floats) keeps the accumulator's order, as the 64 x 64 pieces of the
// untransposed kernels do (dq_accum.cuh): thread t's d[4j .. 4j + 3] at floats 4 (128 j + t)
// .. + 3, so a warpgroup stores it with one 16-byte store per j, consecutive threads at
// consecutive addresses. In the workspace, a query block's kQueries x d floats are its
// consumers' pieces in order (piece c: columns 64c ..), the block m of a (sequence, head) at
// rows m x kQueries of its rows (float (first row) x d).
#pragma once

#include "hopper/host_device.hpp"

namespace warpattn::detail {

// A row and a column of the m64nN accumulator (m: 0..63, n: 0..N-1).
struct AccumulatorCoord {
  int m, n;
};

// The element of an m64nN f32 wgmma accumulator held by register d[i] of thread t (0..127).
WARPATTN_HOST_DEVICE constexpr AccumulatorCoord accumulator_coord(int thread, int i) {
  const int w = thread / 32, g = thread % 32 / 4, q = thread % 4;
  const int j = i / 4, r = i % 4 / 2, c = i % 2;
  return {16 * w + g + 8 * r, 8 * j + 2 * q + c};
}

template <int kQueries>
struct DqTransposedPiece {
  static_assert(kQueries % 8 == 0 && kQueries >= 8 && kQueries <= 256, "an m64nN accumulator");
  static constexpr int kFloats = 64 * kQueries;

  // The first float of piece `piece` (consumer `piece`'s, columns 64 piece ..) of a query block.
  WARPATTN_HOST_DEVICE static constexpr int piece_float0(int piece) { return piece * kFloats; }

  // The piece's float that register d[i] of thread t goes to.
  WARPATTN_HOST_DEVICE static constexpr int float_index(int thread, int i) { return 4 * (128 * (i / 4) + thread) + i % 4; }

  // The dQ element a piece's float `e` holds: its query row within the block and its column
  // within the piece (the piece's first column is 64 x its consumer).
  struct Element {
    int row, column;
  };
  WARPATTN_HOST_DEVICE static constexpr Element element(int e) {
    const int thread = e / 4 % 128, i = 4 * (e / 512) + e % 4;  // float_index's inverse
    const AccumulatorCoord a = accumulator_coord(thread, i);
    return {a.n, a.m};  // transposed: the accumulator's N is the query, M the column
  }
  // The conversion's shared-memory row pitch is the block's columns plus this (dq_accum.cuh).
  static constexpr int kRowPad = 4;
};

// The untransposed kernels' 64 x 64 pieces (dq_accum.cuh's DqAccumLayout: d = 64, 256 and the
// 128-row d = 128 tile): the same order in the piece, but dQ itself on the accumulator, its M
// the query and its N the column, so a float's element is the transposed 64-query piece's,
// row and column swapped.
struct DqUntransposedPiece {
  static constexpr int kFloats = 64 * 64;
  using Element = DqTransposedPiece<64>::Element;
  WARPATTN_HOST_DEVICE static constexpr int piece_float0(int piece) { return piece * kFloats; }
  WARPATTN_HOST_DEVICE static constexpr int float_index(int thread, int i) {
    return DqTransposedPiece<64>::float_index(thread, i);
  }
  WARPATTN_HOST_DEVICE static constexpr Element element(int e) {
    const Element t = DqTransposedPiece<64>::element(e);
    return {t.column, t.row};
  }
  // A warp's 4-byte scatter of one register of its lanes (rows g, columns 2q + c) meets 16
  // even banks at a pitch of 8 mod 32 floats, as at any multiple of 4: a 2-way conflict, the
  // fewest a pitch that keeps the rows' 16-byte reads aligned allows.
  static constexpr int kRowPad = 8;
};

// The conversion's thread map (dq_accum.cuh's convert_dq_kernel): thread t of
// kThreads takes a pass's 16-byte groups t + kThreads k, k = 0, 1, ..; float x of group k goes
// to shared-memory float address(t, k, x) of rows kPitch floats apart. A group of kThreads is
// whole j steps of the accumulator (kThreads a multiple of 128, a piece a whole number of
// groups), so t fixes the lane bits of the element and k and x the rest: address(t, k, x) =
// address(t, 0, 0) + offset(k, x), checked for every t by affine(). The element map is then one
// element() a thread and a constant a float, not ~160 instructions a 16-byte group.
template <class Piece, int kThreads, int kPitch>
struct ConversionThreadMap {
  static constexpr int kGroupsPerPiece = Piece::kFloats / 4 / kThreads;
  static_assert(kThreads % 128 == 0 && kGroupsPerPiece * kThreads * 4 == Piece::kFloats,
                "whole j steps of the accumulator a group, whole groups a piece");
  WARPATTN_HOST_DEVICE static constexpr int address(int thread, int k, int x) {
    const int piece = k / kGroupsPerPiece;
    const typename Piece::Element el = Piece::element(4 * (thread + kThreads * (k % kGroupsPerPiece)) + x);
    return el.row * kPitch + 64 * piece + el.column;
  }
  WARPATTN_HOST_DEVICE static constexpr int offset(int k, int x) { return address(0, k, x) - address(0, 0, 0); }
  // Whether the split into a thread's base and constants holds for groups 0 .. groups - 1.
  static constexpr bool affine(int groups) {
    for (int t = 0; t < kThreads; ++t)
      for (int k = 0; k < groups; ++k)
        for (int x = 0; x < 4; ++x)
          if (address(t, k, x) != address(t, 0, 0) + offset(k, x)) return false;
    return true;
  }
};

// The columns a pass of the conversion (dq_accum.cuh's convert_dq_kernel) puts in shared memory:
// all of them up to 256, fewer where block_m rows at the pitch would pass the 48 KB of static
// shared memory (64 x 256 floats would; 32 x 256 do not). A pass's pieces are consecutive floats.
WARPATTN_HOST_DEVICE constexpr int dq_conversion_columns(int head_dim, int block_m, int row_pad) {
  int columns = head_dim < 256 ? head_dim : 256;
  while (columns > 64 && block_m * (columns + row_pad) * 4 > 48 * 1024) columns /= 2;
  return columns;
}

}  // namespace warpattn::detail
