// The CPU reference checked against attention written out from its definition, and the host
// fp16/bf16 conversions checked against IEEE 754 rounding.
//
// The brute force (reference_brute_force.hpp) deliberately shares nothing with the reference: it
// expands grouped key/value heads into full copies first, computes every score in long double,
// exponentiates without subtracting any maximum (long double's range makes that safe for
// these sizes) and normalises by the explicit row sum.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/host_float16.hpp"
#include "harness.hpp"
#include "reference/reference.hpp"
#include "reference_brute_force.hpp"

namespace {

// The brute force, the reference runner and their comparison are shared with the features'
// tests (reference_brute_force.hpp); with no features they are the plain model's.
using reference_test::AttentionShape;
using reference_test::check_against_brute_force;
using reference_test::Inputs;
using reference_test::random_inputs;
using reference_test::Reference;
using reference_test::run_reference;
using reference_test::shape;

}  // namespace

// ---------------------------------------------------------------- the fp64 reference

TEST(reference_matches_brute_force_non_causal) {
  check_against_brute_force(shape(2, 5, 7, 3, 3, 8, 1 / std::sqrt(8.0), false), 1);
}

TEST(reference_matches_brute_force_causal_square) {
  check_against_brute_force(shape(2, 6, 6, 2, 2, 8, 0.35, true), 2);
}

TEST(reference_matches_brute_force_causal_fewer_queries_than_keys) {
  check_against_brute_force(shape(1, 3, 8, 2, 2, 8, 0.35, true), 3);
}

TEST(reference_matches_brute_force_causal_more_queries_than_keys) {
  const AttentionShape s = shape(1, 8, 3, 1, 1, 4, 0.5, true);
  check_against_brute_force(s, 4);
  // Bottom-right alignment: query i sees keys j <= i - 5, so rows 0..4 see nothing and row 5
  // sees only key 0, whose value it must return exactly.
  const Inputs in = random_inputs(s, 4);
  const Reference r = run_reference(s, in);
  for (int64_t i = 0; i < 5; ++i) {
    CHECK(std::isinf(r.lse[i]) && r.lse[i] < 0) << "row " << i << " lse " << r.lse[i];
    for (int64_t d = 0; d < 4; ++d) CHECK(r.out[i * 4 + d] == 0.0) << "row " << i << " d " << d;
  }
  double score = 0;
  for (int64_t d = 0; d < 4; ++d) score += double(in.q[5 * 4 + d]) * double(in.k[d]);
  CHECK(std::fabs(r.lse[5] - 0.5 * score) < 1e-15) << r.lse[5] << " vs " << 0.5 * score;
  for (int64_t d = 0; d < 4; ++d) CHECK(r.out[5 * 4 + d] == double(in.v[d])) << "d " << d;
}

TEST(reference_with_no_keys_gives_zero_rows_and_negative_infinite_lse) {
  const AttentionShape s = shape(2, 3, 0, 2, 1, 8, 0.3, false);
  const Reference r = run_reference(s, random_inputs(s, 5));
  for (double x : r.out) CHECK(x == 0.0) << x;
  for (double x : r.lse) CHECK(std::isinf(x) && x < 0) << x;
}

TEST(reference_gqa_two_query_heads_per_kv_head) {
  check_against_brute_force(shape(2, 5, 6, 4, 2, 8, 0.4, false), 6);
  check_against_brute_force(shape(2, 5, 6, 4, 2, 8, 0.4, true), 7);
}

TEST(reference_mqa_single_kv_head) {
  check_against_brute_force(shape(2, 5, 6, 4, 1, 8, 0.4, false), 8);
  check_against_brute_force(shape(1, 6, 4, 4, 1, 8, 0.4, true), 9);
}

TEST(reference_threaded_driver_matches_brute_force_on_many_rows) {
  // 2 x 6 x 40 = 480 rows: many chunks, so several threads share the work.
  check_against_brute_force(shape(2, 40, 33, 6, 3, 16, 0.25, true), 10);
}

TEST(reference_scale_variations) {
  for (double scale : {0.01, 0.125, 1.0, 3.0, -0.7})
    check_against_brute_force(shape(1, 4, 9, 2, 2, 8, scale, false), 11);
}

TEST(reference_zero_scale_averages_the_visible_values) {
  // With every score 0 the softmax is uniform: out is the mean of the visible v rows and lse
  // is log(number of visible keys).
  const AttentionShape s = shape(1, 4, 4, 1, 1, 2, 0.0, true);
  const Inputs in = random_inputs(s, 12);
  const Reference r = run_reference(s, in);
  for (int64_t i = 0; i < 4; ++i) {
    CHECK(std::fabs(r.lse[i] - std::log(double(i + 1))) < 1e-15) << "row " << i;
    for (int64_t d = 0; d < 2; ++d) {
      double mean = 0;
      for (int64_t j = 0; j <= i; ++j) mean += in.v[j * 2 + d];
      mean /= double(i + 1);
      CHECK(std::fabs(r.out[i * 2 + d] - mean) < 1e-15) << "row " << i << " d " << d;
    }
  }
}

TEST(reference_stays_finite_when_exp_of_raw_scores_would_overflow_double) {
  // Scores reach about ±1600 here: exp(1600) overflows double, so without subtracting the row
  // maximum the reference would produce inf/NaN. The brute force runs in long double.
  check_against_brute_force(shape(1, 6, 7, 2, 2, 8, 200.0, false), 13);
  check_against_brute_force(shape(1, 6, 7, 2, 2, 8, 200.0, true), 14);
}

TEST(attention_row_matches_the_layout_of_attention) {
  const AttentionShape s = shape(2, 5, 7, 4, 2, 8, 0.3, true);
  const Inputs in = random_inputs(s, 15);
  const Reference all = run_reference(s, in);
  double row[8], lse = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 5; ++i) {
        warpattn::reference::attention_row(s, in.q.data(), in.k.data(), in.v.data(), b, h, i, row,
                                           &lse);
        CHECK(lse == all.lse[(b * 4 + h) * 5 + i]) << b << " " << h << " " << i;
        for (int64_t d = 0; d < 8; ++d)
          CHECK(row[d] == all.out[((b * 5 + i) * 4 + h) * 8 + d]) << b << " " << h << " " << i;
      }
}

TEST(fp32_reference_is_close_to_fp64) {
  const AttentionShape s = shape(1, 16, 512, 2, 1, 128, 1 / std::sqrt(128.0), true);
  const Inputs in = random_inputs(s, 16);
  const Reference want = run_reference(s, in);
  std::vector<float> out(want.out.size()), lse(want.lse.size());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 16; ++i)
      warpattn::reference::attention_row_fp32(s, in.q.data(), in.k.data(), in.v.data(), 0, h, i,
                                              &out[(i * 2 + h) * 128], &lse[h * 16 + i]);
  const auto out_err =
      warpattn::reference::compare(out.data(), want.out.data(), int64_t(out.size()));
  const auto lse_err =
      warpattn::reference::compare(lse.data(), want.lse.data(), int64_t(lse.size()));
  CHECK(out_err.rel_l2 < 1e-5 && out_err.rel_l2 > 0) << "out rel_l2 " << out_err.rel_l2;
  CHECK(lse_err.rel_l2 < 1e-6) << "lse rel_l2 " << lse_err.rel_l2;
  CHECK(out_err.nan_count == 0 && lse_err.nan_count == 0);
}

// ---------------------------------------------------------------- compare()

// FLOPs count the pairs the mask leaves: with Sq = 16384 > Sk = 1024 only the last 1024 query
// rows see keys (1 + 2 + ... + 1024 pairs), 16x fewer than "half of Sq x Sk".
TEST(visible_pairs_counts_the_unmasked_pairs) {
  AttentionShape s;
  s.seqlen_q = 16384, s.seqlen_k = 1024, s.causal = true;
  CHECK(warpattn::reference::visible_pairs(s) == 1024.0 * 1025 / 2) << warpattn::reference::visible_pairs(s);
  s.seqlen_q = 1024, s.seqlen_k = 16384;  // every row sees 15360 + row + 1 keys
  CHECK(warpattn::reference::visible_pairs(s) == 1024.0 * 15360 + 1024.0 * 1025 / 2);
  s.seqlen_q = s.seqlen_k = 7;
  CHECK(warpattn::reference::visible_pairs(s) == 28);
  s.causal = false;
  CHECK(warpattn::reference::visible_pairs(s) == 49);
}

TEST(compare_identical_values_have_no_error) {
  const float got[3] = {1.f, -2.f, 0.5f};
  const double want[3] = {1.0, -2.0, 0.5};
  const auto e = warpattn::reference::compare(got, want, 3);
  CHECK(e.rel_l2 == 0 && e.max_abs == 0 && e.nan_count == 0) << e.rel_l2 << " " << e.max_abs;
}

TEST(compare_reports_relative_l2_max_abs_and_worst_index) {
  const float got[4] = {3.f, 0.f, 4.5f, 1.f};
  const double want[4] = {3.0, 0.0, 4.0, 1.25};
  const auto e = warpattn::reference::compare(got, want, 4);
  // ||diff|| = sqrt(0.25 + 0.0625), ||want|| = sqrt(9 + 16 + 1.5625)
  const double expected = std::sqrt(0.3125) / std::sqrt(26.5625);
  CHECK(std::fabs(e.rel_l2 - expected) < 1e-15) << e.rel_l2 << " vs " << expected;
  CHECK(e.max_abs == 0.5) << e.max_abs;
  CHECK(e.worst_index == 2) << e.worst_index;
  CHECK(e.nan_count == 0);
}

TEST(compare_flags_nan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float got[4] = {1.f, nan, 2.f, nan};
  const double want[4] = {1.0, 1.0, 2.0, 2.0};
  const auto e = warpattn::reference::compare(got, want, 4);
  CHECK(e.nan_count == 2) << e.nan_count;
  CHECK(std::isinf(e.rel_l2)) << e.rel_l2;
  CHECK(std::isinf(e.max_abs)) << e.max_abs;
  CHECK(e.worst_index == 1) << e.worst_index;
}

TEST(compare_matches_negative_infinity_only_exactly) {
  const float inf = std::numeric_limits<float>::infinity();
  const double want[3] = {-HUGE_VAL, 1.0, -HUGE_VAL};
  const float same[3] = {-inf, 1.f, -inf};
  const auto e = warpattn::reference::compare(same, want, 3);
  CHECK(e.rel_l2 == 0 && e.max_abs == 0) << e.rel_l2 << " " << e.max_abs;
  const float wrong[3] = {-inf, 1.f, -1e30f};
  const auto f = warpattn::reference::compare(wrong, want, 3);
  CHECK(std::isinf(f.rel_l2) && f.worst_index == 2) << f.rel_l2 << " " << f.worst_index;
  const float inf_got[2] = {inf, 1.f};
  const double finite_want[2] = {1.0, 1.0};
  CHECK(std::isinf(warpattn::reference::compare(inf_got, finite_want, 2).rel_l2));
}

// ---------------------------------------------------------------- host fp16 / bf16

using namespace warpattn::host;

namespace {
// Exhaustive loops report only their first few mismatches (later ones would be the same bug).
struct FailureBudget {
  int left = 5;
  bool spend() { return left-- > 0; }
};
#define CHECK_FEW(budget, cond)      \
  if ((cond) || !(budget).spend()) { \
  } else                             \
    harness::Failure(__FILE__, __LINE__, #cond)

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }

// The value of an fp16 pattern from the format's definition, computed in double.
double f16_definition(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  double magnitude;
  if (exponent == 31)
    magnitude = mantissa ? std::nan("") : HUGE_VAL;
  else if (exponent == 0)
    magnitude = std::ldexp(double(mantissa), -24);
  else
    magnitude = std::ldexp(double(1024 + mantissa), exponent - 25);
  return sign ? -magnitude : magnitude;
}
}  // namespace

TEST(bf16_known_values) {
  CHECK(float_to_bf16(1.f) == 0x3F80);
  CHECK(float_to_bf16(-2.f) == 0xC000);
  CHECK(float_to_bf16(0.f) == 0x0000);
  CHECK(float_to_bf16(-0.f) == 0x8000);
  CHECK(bf16_to_float(0x3F80) == 1.f);
  CHECK(bf16_to_float(0x4049) == from_bits(0x40490000));  // ~3.140625
  CHECK(bf16_to_float(0x0001) == std::ldexp(1.f, -133));  // smallest subnormal
}

TEST(bf16_rounds_to_nearest_ties_to_even) {
  // 1 + 2^-8 is halfway between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): goes to even.
  CHECK(float_to_bf16(from_bits(0x3F808000)) == 0x3F80);
  // 1 + 3·2^-8 is halfway between 0x3F81 (odd) and 0x3F82 (even): goes up.
  CHECK(float_to_bf16(from_bits(0x3F818000)) == 0x3F82);
  // Just above / below a half.
  CHECK(float_to_bf16(from_bits(0x3F808001)) == 0x3F81);
  CHECK(float_to_bf16(from_bits(0x3F817FFF)) == 0x3F81);
  // The tie rule holds for negative values too.
  CHECK(float_to_bf16(from_bits(0xBF808000)) == 0xBF80);
}

TEST(bf16_nan_inf_and_overflow) {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float_to_bf16(inf) == 0x7F80);
  CHECK(float_to_bf16(-inf) == 0xFF80);
  // A NaN whose payload lives only in the low 16 bits must not truncate to infinity.
  const uint16_t nan_bits = float_to_bf16(from_bits(0x7F800001));
  CHECK((nan_bits & 0x7F80) == 0x7F80 && (nan_bits & 0x007F) != 0) << std::hex << nan_bits;
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK((float_to_bf16(-std::numeric_limits<float>::quiet_NaN()) & 0x8000) != 0);
  // The largest float is past the halfway point above the largest bfloat16 (0x7F7F): inf.
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(float_to_bf16(from_bits(0x7F7F8000)) == 0x7F80);  // exact tie, rounds to even = inf
  CHECK(float_to_bf16(from_bits(0x7F7F7FFF)) == 0x7F7F);
}

TEST(bf16_every_pattern_round_trips) {
  FailureBudget budget;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = bf16_to_float(uint16_t(h));
    CHECK_FEW(budget, std::bit_cast<uint32_t>(f) == h << 16) << std::hex << h;
    if (std::isnan(f)) continue;
    CHECK_FEW(budget, float_to_bf16(f) == h) << std::hex << h;
  }
}

TEST(bf16_every_midpoint_rounds_to_even) {
  // For each pair of adjacent positive finite bfloat16 values, the exact midpoint (9 bits,
  // so exact in float) goes to the even pattern and its float neighbours to the nearer one.
  FailureBudget budget;
  for (uint32_t h = 0; h < 0x7F7F; ++h) {
    const double a = bf16_to_float(uint16_t(h)), b = bf16_to_float(uint16_t(h + 1));
    const float mid = float((a + b) / 2);
    const uint32_t even = (h % 2 == 0) ? h : h + 1;
    CHECK_FEW(budget, float_to_bf16(mid) == even) << std::hex << h;
    CHECK_FEW(budget, float_to_bf16(std::nextafter(mid, 0.f)) == h) << std::hex << h;
    CHECK_FEW(budget, float_to_bf16(std::nextafter(mid, INFINITY)) == h + 1) << std::hex << h;
    CHECK_FEW(budget, float_to_bf16(-mid) == (even | 0x8000)) << std::hex << h;
  }
}

TEST(f16_known_values) {
  CHECK(float_to_f16(1.f) == 0x3C00);
  CHECK(float_to_f16(-2.f) == 0xC000);
  CHECK(float_to_f16(0.f) == 0x0000);
  CHECK(float_to_f16(-0.f) == 0x8000);
  CHECK(float_to_f16(65504.f) == 0x7BFF);
  CHECK(float_to_f16(std::ldexp(1.f, -14)) == 0x0400);   // smallest normal
  CHECK(f16_to_float(0x3555) == from_bits(0x3EAAA000));  // 0.333251953125
}

TEST(f16_rounds_to_nearest_ties_to_even) {
  // 1 + 2^-11 lies halfway between 0x3C00 (even) and 0x3C01: down. 1 + 3·2^-11: up to 0x3C02.
  CHECK(float_to_f16(1.f + std::ldexp(1.f, -11)) == 0x3C00);
  CHECK(float_to_f16(1.f + 3 * std::ldexp(1.f, -11)) == 0x3C02);
  CHECK(float_to_f16(std::nextafter(1.f + std::ldexp(1.f, -11), 2.f)) == 0x3C01);
  // A tie that carries into the exponent: 2 - 2^-11 is halfway between 0x3BFF and 2.0 (0x4000).
  CHECK(float_to_f16(2.f - std::ldexp(1.f, -11)) == 0x4000);
}

TEST(f16_nan_inf_and_overflow) {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float_to_f16(inf) == 0x7C00);
  CHECK(float_to_f16(-inf) == 0xFC00);
  CHECK(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(f16_to_float(float_to_f16(from_bits(0x7F800001)))));  // tiny payload
  CHECK(std::isinf(f16_to_float(0x7C00)) && std::isnan(f16_to_float(0x7C01)));
  // 65520 is halfway between 65504 (odd mantissa) and 65536 (not representable): inf.
  CHECK(float_to_f16(65520.f) == 0x7C00);
  CHECK(float_to_f16(std::nextafter(65520.f, 0.f)) == 0x7BFF);
  CHECK(float_to_f16(-65520.f) == 0xFC00);
  CHECK(float_to_f16(1e10f) == 0x7C00);
  CHECK(float_to_f16(std::numeric_limits<float>::max()) == 0x7C00);
}

TEST(f16_subnormals) {
  const float tiny = std::ldexp(1.f, -24);  // smallest fp16 subnormal
  CHECK(float_to_f16(tiny) == 0x0001);
  CHECK(float_to_f16(-tiny) == 0x8001);
  CHECK(float_to_f16(tiny / 2) == 0x0000);  // tie between 0 and 1: even is 0
  CHECK(float_to_f16(std::nextafter(tiny / 2, 1.f)) == 0x0001);
  CHECK(float_to_f16(tiny / 4) == 0x0000);
  CHECK(float_to_f16(1.5f * tiny) == 0x0002);  // tie between 1 and 2: even is 2
  CHECK(float_to_f16(2.5f * tiny) == 0x0002);  // tie between 2 and 3: even is 2
  CHECK(float_to_f16(1023 * tiny) == 0x03FF);  // largest subnormal
  // Halfway between the largest subnormal and the smallest normal rounds up to the normal.
  CHECK(float_to_f16(1023.5f * tiny) == 0x0400);
  CHECK(float_to_f16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(f16_to_float(0x0001) == tiny);
  CHECK(f16_to_float(0x83FF) == -1023 * tiny);
}

TEST(f16_every_pattern_matches_definition_and_round_trips) {
  FailureBudget budget;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = f16_to_float(uint16_t(h));
    const double want = f16_definition(uint16_t(h));
    if (std::isnan(want)) {
      CHECK_FEW(budget, std::isnan(f)) << std::hex << h;
      CHECK_FEW(budget, std::isnan(f16_to_float(float_to_f16(f)))) << std::hex << h;
      continue;
    }
    CHECK_FEW(budget, double(f) == want && std::signbit(f) == std::signbit(want)) << std::hex << h;
    CHECK_FEW(budget, float_to_f16(f) == h) << std::hex << h;
  }
}

TEST(f16_every_midpoint_rounds_to_even) {
  // As for bf16: every midpoint between adjacent positive finite fp16 values, subnormals
  // included (12 significant bits, exact in float).
  FailureBudget budget;
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const double a = f16_to_float(uint16_t(h)), b = f16_to_float(uint16_t(h + 1));
    const float mid = float((a + b) / 2);
    const uint32_t even = (h % 2 == 0) ? h : h + 1;
    CHECK_FEW(budget, float_to_f16(mid) == even) << std::hex << h;
    CHECK_FEW(budget, float_to_f16(std::nextafter(mid, 0.f)) == h) << std::hex << h;
    CHECK_FEW(budget, float_to_f16(std::nextafter(mid, INFINITY)) == h + 1) << std::hex << h;
    CHECK_FEW(budget, float_to_f16(-mid) == (even | 0x8000)) << std::hex << h;
  }
}
