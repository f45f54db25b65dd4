// The dQ pieces of the backward (hopper/backward/dq_transposed_layout.hpp), transposed (the
// 80-row d = 128 tile, d = 512) and not: where the consumer puts each accumulator register and
// where the conversion kernel finds each dQ element must be the same place, and both must cover
// the block exactly once, in the conversion's passes too. Also the
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
using warpattn::detail::DqUntransposedPiece;

// The PTX ISA's m64nN f32 accumulator fragment, written out here independently of
// accumulator_coord: thread t's d[i] is row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2),
// column 8 (i / 4) + 2 (t % 4) + i % 2.
int fragment_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
int fragment_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }

// The dQ element (query row, column in the piece) that register d[i] of thread t holds: the
// accumulator's (N, M) when transposed (dQᵀ = Kᵀ·dSᵀ), its (M, N) otherwise.
struct RowColumn {
  int row, column;
};
RowColumn dq_element(int t, int i, bool transposed) {
  return transposed ? RowColumn{fragment_col(t, i), fragment_row(t, i)} : RowColumn{fragment_row(t, i), fragment_col(t, i)};
}

template <class Piece, int kQueries, bool kTransposed>
int piece_mismatches() {
  constexpr int kRegisters = Piece::kFloats / 128;
  int bad = 0;
  std::vector<int> writes(Piece::kFloats, 0), elements(Piece::kFloats, 0);
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < kRegisters; ++i) {
      const int e = Piece::float_index(t, i);
      if (e < 0 || e >= Piece::kFloats) {
        ++bad;
        continue;
      }
      ++writes[e];
      // The conversion's reading of float e: the element the register holds.
      const auto el = Piece::element(e);
      const RowColumn want = dq_element(t, i, kTransposed);
      if (el.row != want.row || el.column != want.column) ++bad;
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
  CHECK((piece_mismatches<DqTransposedPiece<80>, 80, true>() == 0)) << piece_mismatches<DqTransposedPiece<80>, 80, true>();
  CHECK((piece_mismatches<DqTransposedPiece<64>, 64, true>() == 0)) << piece_mismatches<DqTransposedPiece<64>, 64, true>();
  CHECK((piece_mismatches<DqTransposedPiece<96>, 96, true>() == 0)) << piece_mismatches<DqTransposedPiece<96>, 96, true>();
  CHECK((piece_mismatches<DqTransposedPiece<32>, 32, true>() == 0)) << piece_mismatches<DqTransposedPiece<32>, 32, true>();
}

TEST(dq_untransposed_piece_is_a_bijection_matching_the_fragment) {
  CHECK((piece_mismatches<DqUntransposedPiece, 64, false>() == 0)) << piece_mismatches<DqUntransposedPiece, 64, false>();
}

// A whole query block as the consumers write it (piece c at piece_float0(c), each register of
// thread t holding dQ[query][64 c + column] of dq_element) and as convert_dq_kernel reads it:
// in passes of dq_conversion_columns columns, whose floats start kRows x the pass's first column
// in; 16-byte group e of a pass: piece e / (kFloats / 4), its floats 4e - piece_float0(piece) ..,
// each to row el.row, column 64 piece + el.column of the pass.
template <class Piece, int kRows, int kHeadDim, bool kTransposed>
int block_round_trip_mismatches() {
  constexpr int kColumns = warpattn::detail::dq_conversion_columns(kHeadDim, kRows, Piece::kRowPad);
  const auto value = [](int row, int col) { return static_cast<float>(row * 1000 + col); };
  std::vector<float> block(kRows * kHeadDim, -1.f);
  for (int c = 0; c < kHeadDim / 64; ++c)
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < Piece::kFloats / 128; ++i) {
        const RowColumn el = dq_element(t, i, kTransposed);
        block[Piece::piece_float0(c) + Piece::float_index(t, i)] = value(el.row, 64 * c + el.column);
      }
  std::vector<float> rows(kRows * kHeadDim, -2.f);
  std::vector<int> hits(kRows * kHeadDim, 0);
  int bad = kHeadDim % kColumns == 0 && kRows * (kColumns + Piece::kRowPad) * 4 <= 48 * 1024 ? 0 : 1;
  for (int column0 = 0; column0 < kHeadDim; column0 += kColumns) {
    const float* pass = block.data() + kRows * column0;
    for (int e = 0; e < kRows * kColumns / 4; ++e) {  // the kernel's loop, one 16-byte group each
      const int piece = e / (Piece::kFloats / 4), first = 4 * e - Piece::piece_float0(piece);
      for (int k = 0; k < 4; ++k) {
        const auto el = Piece::element(first + k);
        const int at = el.row * kHeadDim + column0 + 64 * piece + el.column;
        rows[at] = pass[4 * e + k];
        ++hits[at];
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int col = 0; col < kHeadDim; ++col)
      if (hits[r * kHeadDim + col] != 1 || rows[r * kHeadDim + col] != value(r, col)) ++bad;
  return bad;
}

TEST(dq_transposed_block_round_trip) {
  CHECK((block_round_trip_mismatches<DqTransposedPiece<80>, 80, 128, true>() == 0));
  CHECK((block_round_trip_mismatches<DqTransposedPiece<32>, 32, 512, true>() == 0));  // two passes
}

// convert_dq_kernel's thread map (ConversionThreadMap): thread t's group k of
// a pass, float x, stored at its base (address(t, 0, 0)) plus offset(k, x), must be where the
// per-group element map above stores it (row el.row at the pass's pitch, column 64 piece +
// el.column), for every thread of the 256 and every group of the pass. The kernel static_asserts
// the split (affine()); this checks the places themselves against the element map.
template <class Piece, int kRows, int kHeadDim>
int thread_map_mismatches() {
  constexpr int kThreads = 256;
  constexpr int kColumns = warpattn::detail::dq_conversion_columns(kHeadDim, kRows, Piece::kRowPad);
  constexpr int kPitch = kColumns + Piece::kRowPad;
  using Map = warpattn::detail::ConversionThreadMap<Piece, kThreads, kPitch>;
  constexpr int kGroups = kRows * kColumns / 4;
  int bad = kGroups % kThreads == 0 ? 0 : 1;
  for (int t = 0; t < kThreads; ++t)
    for (int k = 0; k < kGroups / kThreads; ++k) {
      const int e = t + kThreads * k;  // the group, as the per-group loop numbers them
      const int piece = e / (Piece::kFloats / 4), first = 4 * e - Piece::piece_float0(piece);
      for (int x = 0; x < 4; ++x) {
        const auto el = Piece::element(first + x);
        if (Map::address(t, 0, 0) + Map::offset(k, x) != el.row * kPitch + 64 * piece + el.column) ++bad;
      }
    }
  return bad;
}

TEST(dq_conversion_thread_map_matches_the_element_map) {
  CHECK((thread_map_mismatches<DqTransposedPiece<80>, 80, 128>() == 0));
  CHECK((thread_map_mismatches<DqTransposedPiece<32>, 32, 512>() == 0));
  CHECK((thread_map_mismatches<DqUntransposedPiece, 64, 64>() == 0));
  CHECK((thread_map_mismatches<DqUntransposedPiece, 64, 128>() == 0));
  CHECK((thread_map_mismatches<DqUntransposedPiece, 64, 256>() == 0));
}

TEST(dq_untransposed_block_round_trip) {
  using warpattn::detail::dq_conversion_columns;
  CHECK((block_round_trip_mismatches<DqUntransposedPiece, 64, 64, false>() == 0));
  CHECK((block_round_trip_mismatches<DqUntransposedPiece, 64, 128, false>() == 0));
  CHECK((block_round_trip_mismatches<DqUntransposedPiece, 64, 256, false>() == 0));  // two passes of 128
  CHECK(dq_conversion_columns(256, 64, DqUntransposedPiece::kRowPad) == 128);
  CHECK(dq_conversion_columns(128, 80, DqTransposedPiece<80>::kRowPad) == 128);
  CHECK(dq_conversion_columns(512, 32, DqTransposedPiece<32>::kRowPad) == 256);
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
