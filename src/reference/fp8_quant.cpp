#include "reference/fp8_quant.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/fp8_signs.hpp"
#include "common/host_fp8.hpp"

namespace warpattn::reference {

void walsh_hadamard(double* x, int n) {
  if (n <= 0 || (n & (n - 1)) != 0) throw std::invalid_argument("walsh_hadamard: n must be a power of two");
  for (int h = 1; h < n; h *= 2)  // butterflies: O(n log n) additions
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const double norm = 1.0 / std::sqrt(static_cast<double>(n));
  for (int i = 0; i < n; ++i) x[i] *= norm;
}

std::vector<int8_t> random_signs(int n, uint64_t seed) {
  std::vector<int8_t> signs(n);
  for (int i = 0; i < n; ++i) signs[i] = fp8_sign_is_negative(seed, i) ? -1 : 1;
  return signs;
}

void rotate_rows(double* x, int64_t rows, int n, const std::vector<int8_t>& signs) {
  for (int64_t r = 0; r < rows; ++r) {
    double* row = x + r * n;
    for (int i = 0; i < n; ++i) row[i] *= signs[i];
    walsh_hadamard(row, n);
  }
}

double Quantized::dequantized(int64_t row, int col) const {
  const uint8_t c = codes[row * n + col];
  const double value = int8 ? static_cast<double>(static_cast<int8_t>(c)) : static_cast<double>(host::e4m3_to_float(c));
  return value * descales[row / block_rows];
}

Quantized quantize_blocks(const double* x, int64_t rows, int n, int block_rows, bool int8) {
  constexpr double kInt8Max = 127;
  Quantized q;
  q.n = n;
  q.block_rows = block_rows;
  q.int8 = int8;
  q.codes.resize(rows * n);
  for (int64_t b0 = 0; b0 < rows; b0 += block_rows) {
    const int64_t b1 = std::min<int64_t>(rows, b0 + block_rows);
    double amax = 0;
    for (int64_t i = b0 * n; i < b1 * n; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float descale = amax > 0 ? static_cast<float>(amax / (int8 ? kInt8Max : host::kE4m3Max)) : 1.f;
    q.descales.push_back(descale);
    for (int64_t i = b0 * n; i < b1 * n; ++i) {
      const float scaled = static_cast<float>(x[i] / descale);
      // std::nearbyint rounds ties to even in the default rounding mode.
      q.codes[i] = int8 ? static_cast<uint8_t>(static_cast<int8_t>(
                              std::nearbyint(std::clamp(scaled, static_cast<float>(-kInt8Max), static_cast<float>(kInt8Max)))))
                        : host::float_to_e4m3(scaled);
    }
  }
  return q;
}

}  // namespace warpattn::reference
