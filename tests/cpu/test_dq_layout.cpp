// The transposed dQ pieces of the 80-row backward (hopper/backward/dq_transposed_layout.hpp):
// where the consumer puts each accumulator register and where the conversion kernel finds each
// dQ element must be the same place, and both must cover the block exactly once. Also the
// workspace padding those kernels rely on (hopper/backward/workspace.hpp): with the 320-row
// granule, neither an 80-row query block nor a 64-row row-kernel block of a sequence reaches
// into another sequence's rows, and every block finds its own sequence.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "harness.hpp"
#include "hopper/backward/dq_transposed_layout.hpp"
#include "hopper/backward/workspace.hpp"

namespace {

using warpattn::detail::DqTransposedPiece;

// The PTX ISA's m64nN f32 accumulator fragment, written out here independently of
// accumulator_coord: thread t's d[i] is row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2),
// column 8 (i / 4) + 2 (t % 4) + i % 2.
int fragment_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
int fragment_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }

template <int kQueries>
int piece_mismatches() {
  using Piece = DqTransposedPiece<kQueries>;
  int bad = 0;
  std::vector<int> writes(Piece::kFloats, 0), elements(Piece::kFloats, 0);
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < Piece::kRegisters; ++i) {
      const int e = Piece::float_index(t, i);
      if (e < 0 || e >= Piece::kFloats) {
        ++bad;
        continue;
      }
      ++writes[e];
      // The conversion's reading of float e: dQ[query][column] = dQᵀ[column][query], the
      // accumulator's (M, N) = (column, query).
      const auto el = Piece::element(e);
      if (el.row != fragment_col(t, i) || el.column != fragment_row(t, i)) ++bad;
      // Registers 4j .. 4j + 3 of a thread are one 16-byte group (the consumer's float4 store).
      if (e % 4 != i % 4 || e / 4 != 128 * (i / 4) + t) ++bad;
    }
  for (int e = 0; e < Piece::kFloats; ++e) {
    if (writes[e] != 1) ++bad;  // every float written exactly once
    const auto el = Piece::element(e);
    if (el.row < 0 || el.row >= kQueries || el.column < 0 || el.column >= 64) {
      ++bad;
      continue;
    }
    ++elements[el.row * 64 + el.column];
  }
  for (int x : elements)
    if (x != 1) ++bad;  // every element of the 64 x kQueries piece read exactly once
  return bad;
}

}  // namespace

TEST(dq_transposed_piece_is_a_bijection_matching_the_fragment) {
  CHECK(piece_mismatches<80>() == 0) << piece_mismatches<80>();
  CHECK(piece_mismatches<64>() == 0) << piece_mismatches<64>();
  CHECK(piece_mismatches<96>() == 0) << piece_mismatches<96>();
}

// A whole 80 x 128 query block as the two consumers write it (piece c at piece_float0(c), each
// register of thread t of consumer c holding dQ[query][64 c + m]) and as
// convert_dq_transposed_kernel reads it (16-byte group e: piece e / (kFloats / 4), its floats
// 4e - piece_float0(piece) .., each to row el.row, column 64 piece + el.column).
TEST(dq_transposed_block_round_trip) {
  constexpr int kQueries = 80, kHeadDim = 128;
  using Piece = DqTransposedPiece<kQueries>;
  const auto value = [](int row, int col) { return static_cast<float>(row * 1000 + col); };
  std::vector<float> block(kQueries * kHeadDim, -1.f);
  for (int c = 0; c < kHeadDim / 64; ++c)
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < Piece::kRegisters; ++i)
        block[Piece::piece_float0(c) + Piece::float_index(t, i)] = value(fragment_col(t, i), 64 * c + fragment_row(t, i));
  std::vector<float> rows(kQueries * kHeadDim, -2.f);
  std::vector<int> hits(kQueries * kHeadDim, 0);
  for (int e = 0; e < kQueries * kHeadDim / 4; ++e) {  // the kernel's loop, one 16-byte group each
    const int piece = e / (Piece::kFloats / 4), first = 4 * e - Piece::piece_float0(piece);
    for (int k = 0; k < 4; ++k) {
      const auto el = Piece::element(first + k);
      const int at = el.row * kHeadDim + 64 * piece + el.column;
      rows[at] = block[4 * e + k];
      ++hits[at];
    }
  }
  int bad = 0;
  for (int r = 0; r < kQueries; ++r)
    for (int col = 0; col < kHeadDim; ++col)
      if (hits[r * kHeadDim + col] != 1 || rows[r * kHeadDim + col] != value(r, col)) ++bad;
  CHECK(bad == 0) << bad << " of " << kQueries * kHeadDim << " elements";
}

// The packed batch's padding with granule G: sequence b's blocks of `block` rows (80: the main
// kernel's and the conversion's; 64: the row kernels') from varlen_row0<G>(b) up to its length
// stay below the next sequence's start and the padded total, and sequence_of_padded_row<G> maps
// each block's first row back to b.
template <int kGranule>
int padding_mismatches(const std::vector<int>& lengths, int block) {
  using warpattn::detail::sequence_of_padded_row;
  using warpattn::detail::varlen_padded_rows;
  using warpattn::detail::varlen_row0;
  const int batch = static_cast<int>(lengths.size());
  std::vector<int> cu(batch + 1, 0);
  for (int b = 0; b < batch; ++b) cu[b + 1] = cu[b] + lengths[b];
  const int total = cu[batch];
  const int64_t padded = varlen_padded_rows(total, batch, kGranule);
  int bad = 0;
  if (padded % kGranule != 0) ++bad;
  for (int b = 0; b < batch; ++b) {
    const int64_t row0 = varlen_row0<kGranule>(cu[b], b);
    const int64_t next = b + 1 < batch ? varlen_row0<kGranule>(cu[b + 1], b + 1) : padded;
    if (row0 % kGranule != 0) ++bad;
    const int blocks = (lengths[b] + block - 1) / block;
    if (row0 + static_cast<int64_t>(blocks) * block > next) ++bad;  // into the next sequence's rows
    for (int m = 0; m < blocks; ++m)
      if (lengths[b] > 0 && sequence_of_padded_row<kGranule>(cu.data(), batch, total, row0 + m * block) != b) ++bad;
  }
  return bad;
}

TEST(backward_workspace_granule_keeps_blocks_in_their_sequence) {
  using warpattn::detail::backward_row_granule;
  int bad = 0, cases = 0;
  uint32_t seed = 12345;
  const auto next = [&seed] { return seed = seed * 1664525u + 1013904223u; };
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int> lengths(1 + next() % 9);
    for (int& l : lengths) {
      const uint32_t kind = next() % 4;  // around the blocks' and granules' edges, and anything
      l = kind == 0 ? static_cast<int>(next() % 3) : kind == 1 ? static_cast<int>(80 * (next() % 9) + next() % 3) - 1
                                                     : static_cast<int>(next() % 1500);
      l = std::max(l, 0);
    }
    for (int len : {250, 319, 320, 321, 639, 640})
      if (trial == 0) lengths.push_back(len);
    bad += padding_mismatches<320>(lengths, 80) + padding_mismatches<320>(lengths, 64);
    bad += padding_mismatches<128>(lengths, 64) + padding_mismatches<128>(lengths, 128);
    cases += 4;
  }
  CHECK(bad == 0) << bad << " mismatches over " << cases << " cases";
  // The 128-row padding would not hold 80-row blocks: a 250-row sequence covers 320 rows of them.
  CHECK(padding_mismatches<128>({250, 10}, 80) > 0);
  // The default build keeps 128 everywhere (the knobs at 64); a knob at 80 changes only d = 128.
  CHECK(backward_row_granule(64) == 128 && backward_row_granule(256) == 128);
  CHECK(backward_row_granule(128) == 128 || backward_row_granule(128) == 320);
}
