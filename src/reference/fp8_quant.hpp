// The CPU reference for FP8 attention inputs: the incoherent rotation of Q and K (a random
// +-1 diagonal, then the normalised Walsh-Hadamard transform) and block quantisation to E4M3
// with one descale factor per block of rows. The GPU quantisation pass and the FP8 kernel's
// tests are checked against these.
#pragma once

#include <cstdint>
#include <vector>

namespace warpattn::reference {

// In place: x <- H x / sqrt(n), H the Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i&j)),
// n = x.size() a power of two. Orthogonal and its own inverse.
void walsh_hadamard(double* x, int n);

// The +-1 diagonal of the rotation, drawn from `seed` (the same on Q and K).
std::vector<int8_t> random_signs(int n, uint64_t seed);

// In place on each of `rows` rows of length n (contiguous): x <- H D x / sqrt(n). Applied to
// both Q and K it leaves every dot product q.k unchanged (up to rounding).
void rotate_rows(double* x, int64_t rows, int n, const std::vector<int8_t>& signs);

// E4M3 codes and one descale factor per block of `block_rows` rows (the last block may be
// shorter): descale = max |x| over the block / 448 (1 for an all-zero block), code =
// e4m3(x / descale). block_rows >= rows gives per-tensor scaling.
// int8: INT8 codes instead, descale = max |x| / 127, code = x / descale rounded to the nearest
// integer (ties to even) within +-127.
struct Quantized {
  std::vector<uint8_t> codes;    // rows * n (int8: the code's two's-complement byte)
  std::vector<float> descales;   // one per block
  int block_rows = 0;
  int n = 0;
  bool int8 = false;
  // The value the FP8 kernel sees for element (row, col): the code's value times its block's
  // descale.
  double dequantized(int64_t row, int col) const;
};
Quantized quantize_blocks(const double* x, int64_t rows, int n, int block_rows, bool int8 = false);

}  // namespace warpattn::reference
