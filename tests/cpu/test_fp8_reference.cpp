// The FP8 building blocks on the CPU: E4M3 conversion against the format's definition, the
// fast Walsh-Hadamard transform against the matrix definition, and the block-scale
// arithmetic. They are the references the FP8 quantisation pass and kernel will be held to.
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "common/host_fp8.hpp"
#include "harness.hpp"
#include "reference/fp8_quant.hpp"

using warpattn::host::e4m3_to_float;
using warpattn::host::float_to_e4m3;

TEST(e4m3_decodes_the_format_definition) {
  CHECK(e4m3_to_float(0x00) == 0.f && !std::signbit(e4m3_to_float(0x00)));
  CHECK(e4m3_to_float(0x80) == 0.f && std::signbit(e4m3_to_float(0x80)));
  CHECK(std::isnan(e4m3_to_float(0x7F)) && std::isnan(e4m3_to_float(0xFF)));
  CHECK(e4m3_to_float(0x7E) == 448.f);                 // S.1111.110: the largest value
  CHECK(e4m3_to_float(0x78) == 256.f);                 // S.1111.000: exponent 15 is finite here
  CHECK(e4m3_to_float(0x38) == 1.f);                   // exponent bias 7
  CHECK(e4m3_to_float(0x08) == std::ldexp(1.f, -6));   // smallest normal
  CHECK(e4m3_to_float(0x01) == std::ldexp(1.f, -9));   // smallest subnormal
  CHECK(e4m3_to_float(0x07) == 7 * std::ldexp(1.f, -9));
  CHECK(e4m3_to_float(0xBC) == -1.5f);
  for (int c = 1; c <= 0x7E; ++c) CHECK(e4m3_to_float(c) > e4m3_to_float(c - 1)) << "code " << c;
}

TEST(e4m3_round_trips_every_finite_code) {
  int bad = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    bad += float_to_e4m3(e4m3_to_float(c)) != c;
  }
  CHECK(bad == 0) << bad << " codes do not round-trip";
}

// Between two neighbours: the midpoint goes to the one with the even mantissa (code), and a
// hair either side goes to the nearer one.
TEST(e4m3_rounds_to_nearest_ties_to_even) {
  int bad = 0;
  for (int c = 0; c < 0x7E; ++c) {
    const double lo = e4m3_to_float(c), hi = e4m3_to_float(c + 1), mid = 0.5 * (lo + hi);
    const int even = (c % 2 == 0) ? c : c + 1;
    bad += float_to_e4m3(static_cast<float>(mid)) != even;
    bad += float_to_e4m3(std::nextafter(static_cast<float>(mid), 0.f)) != c;
    bad += float_to_e4m3(std::nextafter(static_cast<float>(mid), 1e9f)) != c + 1;
    bad += float_to_e4m3(static_cast<float>(-mid)) != (0x80 | even);
  }
  CHECK(bad == 0) << bad << " rounding mistakes";
}

TEST(e4m3_saturates_and_keeps_nan) {
  for (float x : {448.f, 449.f, 464.f, 480.f, 1e6f, INFINITY})
    CHECK(float_to_e4m3(x) == 0x7E) << x;
  for (float x : {-449.f, -1e30f, -INFINITY}) CHECK(float_to_e4m3(x) == 0xFE) << x;
  CHECK((float_to_e4m3(std::nanf("")) & 0x7F) == 0x7F);
}

TEST(e4m3_subnormals_and_underflow) {
  const float tiny = std::ldexp(1.f, -9);
  for (int k = 1; k <= 7; ++k) CHECK(float_to_e4m3(k * tiny) == k) << k;
  CHECK(float_to_e4m3(0.5f * tiny) == 0x00);                  // tie: to the even code, 0
  CHECK(float_to_e4m3(0.51f * tiny) == 0x01);
  CHECK(float_to_e4m3(-0.4f * tiny) == 0x80);                 // keeps the sign of zero
  CHECK(float_to_e4m3(7.5f * tiny) == 0x08);                  // rounds up into the normals
}

TEST(walsh_hadamard_matches_the_matrix_definition) {
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal;
  for (int n : {1, 2, 8, 64, 128, 256}) {
    std::vector<double> x(n), fast;
    for (auto& e : x) e = normal(rng);
    fast = x;
    warpattn::reference::walsh_hadamard(fast.data(), n);
    double err = 0;
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += (std::popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0) * x[j];
      err = std::max(err, std::fabs(fast[i] - s / std::sqrt(double(n))));
    }
    CHECK(err < 1e-12) << "n=" << n << " max error " << err;
    warpattn::reference::walsh_hadamard(fast.data(), n);  // its own inverse
    double back = 0;
    for (int i = 0; i < n; ++i) back = std::max(back, std::fabs(fast[i] - x[i]));
    CHECK(back < 1e-12) << "n=" << n;
  }
}

TEST(rotation_keeps_dot_products) {
  const int n = 128;
  std::mt19937_64 rng(2);
  std::normal_distribution<double> normal;
  std::vector<double> q(n), k(n);
  for (int i = 0; i < n; ++i) q[i] = normal(rng), k[i] = normal(rng);
  double before = 0;
  for (int i = 0; i < n; ++i) before += q[i] * k[i];
  const auto signs = warpattn::reference::random_signs(n, 42);
  warpattn::reference::rotate_rows(q.data(), 1, n, signs);
  warpattn::reference::rotate_rows(k.data(), 1, n, signs);
  double after = 0;
  for (int i = 0; i < n; ++i) after += q[i] * k[i];
  CHECK(std::fabs(after - before) < 1e-10) << before << " vs " << after;
  CHECK(signs != warpattn::reference::random_signs(n, 43)) << "the seed must matter";
}

// 300 rows of 64 N(0, 1) values, the rows from 128 on 50x larger: blocks of 128 rows with
// different maxima (128 + 128 + 44 rows).
constexpr int kBlockTestRows = 300, kBlockTestCols = 64;
std::vector<double> block_test_data(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> x(kBlockTestRows * kBlockTestCols);
  for (int64_t i = 0; i < kBlockTestRows * kBlockTestCols; ++i)
    x[i] = normal(rng) * (i / kBlockTestCols < 128 ? 1.0 : 50.0);
  return x;
}

TEST(block_scales_are_block_maxima_over_448) {
  const int rows = kBlockTestRows, n = kBlockTestCols, block = 128;
  const std::vector<double> x = block_test_data(3);
  const auto q = warpattn::reference::quantize_blocks(x.data(), rows, n, block);
  REQUIRE(q.descales.size() == 3u);  // 128 + 128 + 44 rows
  for (int b = 0; b < 3; ++b) {
    double amax = 0;
    for (int64_t i = int64_t(b) * block * n; i < std::min<int64_t>(rows, (b + 1) * block) * n; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    CHECK(std::fabs(q.descales[b] - amax / 448) <= 1e-6 * amax) << "block " << b;
  }
  // Every element within half an E4M3 step of its value (relative 2^-4 for normal numbers),
  // and the block maximum lands on +-448.
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < n; ++c) {
      const double v = x[r * n + c], d = q.dequantized(r, c), scale = q.descales[r / block];
      const double step_floor = std::ldexp(1.0, -9) * scale;  // subnormal quantum
      bad += std::fabs(d - v) > std::max(std::fabs(v) * 0x1p-4, 0.5 * step_floor) * (1 + 1e-6);
    }
  CHECK(bad == 0) << bad << " elements outside half a step";
}

// INT8 Q and K: descale = block amax / 127, codes rounded to the nearest integer (ties to
// even) within +-127, so every element within half a step (descale / 2) of its value, the block
// maximum on +-127, and -128 never written.
TEST(int8_block_scales_round_to_nearest_within_127) {
  const int rows = kBlockTestRows, n = kBlockTestCols, block = 128;
  std::vector<double> x = block_test_data(5);
  x[5] = -std::fabs(x[5]) - 10;  // block 0's amax is a negative value
  x[200 * n + 3] = 0;
  const auto q = warpattn::reference::quantize_blocks(x.data(), rows, n, block, true);
  REQUIRE(q.descales.size() == 3u && q.int8);
  int bad = 0, out_of_range = 0;
  for (int b = 0; b < 3; ++b) {
    double amax = 0;
    for (int64_t i = int64_t(b) * block * n; i < std::min<int64_t>(rows, (b + 1) * block) * n; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    CHECK(std::fabs(q.descales[b] - amax / 127) <= 1e-6 * amax) << "block " << b;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < n; ++c) {
      const int code = static_cast<int8_t>(q.codes[r * n + c]);
      out_of_range += code < -127 || code > 127;
      bad += std::fabs(q.dequantized(r, c) - x[r * n + c]) > 0.5 * q.descales[r / block] * (1 + 1e-6);
    }
  CHECK(bad == 0) << bad << " elements outside half a step";
  CHECK(out_of_range == 0) << out_of_range << " codes outside +-127";
  CHECK(static_cast<int8_t>(q.codes[5]) == -127) << "block maximum not on -127";
  CHECK(q.codes[200 * n + 3] == 0);
  // Ties to even: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2 (descale 1 with a planted 127).
  std::vector<double> t = {127, 2.5, 3.5, -2.5};
  const auto qt = warpattn::reference::quantize_blocks(t.data(), 1, 4, 128, true);
  CHECK(static_cast<int8_t>(qt.codes[1]) == 2 && static_cast<int8_t>(qt.codes[2]) == 4 &&
        static_cast<int8_t>(qt.codes[3]) == -2)
      << "ties: " << int(static_cast<int8_t>(qt.codes[1])) << " " << int(static_cast<int8_t>(qt.codes[2])) << " "
      << int(static_cast<int8_t>(qt.codes[3]));
}

// What the design rests on: with an outlier channel, per-tensor FP8 loses the small channels;
// the Hadamard rotation spreads the outlier over all channels so Q·Kᵀ survives quantisation
// (measured here: 10x lower error). Block scales help where outliers sit in some rows only;
// on this row-homogeneous data they must at least not hurt.
TEST(rotation_cuts_the_fp8_error_of_q_k_and_block_scales_do_not_hurt) {
  const int rows = 256, n = 128;
  std::mt19937_64 rng(4);
  std::normal_distribution<double> normal;
  std::vector<double> q(rows * n), k(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) {
    q[i] = normal(rng), k[i] = normal(rng);
    if (i % n == 5) q[i] *= 30, k[i] *= 30;  // one outlier channel
  }
  auto scores_rmse = [&](const std::vector<double>& a, const std::vector<double>& b, int block) {
    const auto qa = warpattn::reference::quantize_blocks(a.data(), rows, n, block);
    const auto qb = warpattn::reference::quantize_blocks(b.data(), rows, n, block);
    double se = 0, ss = 0;
    for (int i = 0; i < rows; i += 7)
      for (int j = 0; j < rows; j += 5) {
        double exact = 0, fp8 = 0;
        for (int c = 0; c < n; ++c) {
          exact += a[i * n + c] * b[j * n + c];
          fp8 += qa.dequantized(i, c) * qb.dequantized(j, c);
        }
        se += (fp8 - exact) * (fp8 - exact);
        ss += exact * exact;
      }
    return std::sqrt(se / ss);
  };
  const double plain = scores_rmse(q, k, rows);
  auto qr = q, kr = k;
  const auto signs = warpattn::reference::random_signs(n, 7);
  warpattn::reference::rotate_rows(qr.data(), rows, n, signs);
  warpattn::reference::rotate_rows(kr.data(), rows, n, signs);
  const double rotated = scores_rmse(qr, kr, rows);
  const double rotated_blocks = scores_rmse(qr, kr, 64);
  std::printf("    relative RMSE of q.k: per tensor %.3e, rotated %.3e, rotated + 64-row blocks %.3e\n",
              plain, rotated, rotated_blocks);
  CHECK(rotated < plain / 2) << plain << " -> " << rotated;
  CHECK(rotated_blocks <= rotated * 1.05) << rotated << " -> " << rotated_blocks;
}
