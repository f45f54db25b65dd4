// The forward reference's model features (issue 19: sliding window, soft cap, attention sinks)
// checked against attention written out from FlashAttention's definitions.
//
// The mask is checked twice over: the test's own mask matrix (the window inequalities typed in
// from the definition, nothing taken from the reference) against matrices written out by hand,
// and the reference's ranges against that matrix. The brute force (reference_brute_force.hpp)
// then shares nothing with the reference: GQA expanded into full copies, every logit in long
// double, the soft cap evaluated as its formula, exp without a maximum subtracted (long double's
// range covers these logits), the sink added to the explicit row sum, masked entries zeroed
// from the matrix.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "harness.hpp"
#include "reference/reference.hpp"
#include "reference_brute_force.hpp"

namespace {

// The brute force, the reference runner and their comparison are shared with the plain model's
// tests (reference_brute_force.hpp).
using reference_test::AttentionShape;
using reference_test::bound;
using reference_test::check_against_brute_force;
using reference_test::Inputs;
using reference_test::mask_by_definition;
using reference_test::random_inputs;
using reference_test::Reference;
using reference_test::run_reference;
using reference_test::shape;

// A mask written out by hand, one string per query row, 'X' for a visible key.
std::vector<char> mask_from_rows(const std::vector<std::string>& rows) {
  std::vector<char> mask;
  for (const std::string& row : rows)
    for (char c : row) mask.push_back(c == 'X');
  return mask;
}

// The reference's ranges, counts and pair total against a mask matrix.
void check_ranges_against(const AttentionShape& s, const std::vector<char>& mask, const std::string& name) {
  namespace ref = warpattn::reference;
  double pairs = 0;
  for (int64_t i = 0; i < s.seqlen_q; ++i) {
    const ref::IndexRange keys = ref::visible_key_range(s, i);
    int64_t count = 0;
    for (int64_t j = 0; j < s.seqlen_k; ++j) {
      const bool in_range = j >= keys.first && j < keys.end;
      CHECK(in_range == bool(mask[i * s.seqlen_k + j])) << name << ": row " << i << " key " << j;
      count += mask[i * s.seqlen_k + j];
    }
    CHECK(ref::visible_keys(s, i) == count) << name << ": row " << i;
    CHECK(keys.first >= 0 && keys.first <= keys.end && keys.end <= s.seqlen_k) << name << ": row " << i;
    pairs += double(count);
  }
  for (int64_t j = 0; j < s.seqlen_k; ++j) {
    const ref::IndexRange rows = ref::visible_row_range(s, j);
    for (int64_t i = 0; i < s.seqlen_q; ++i)
      CHECK((i >= rows.first && i < rows.end) == bool(mask[i * s.seqlen_k + j])) << name << ": key " << j << " row " << i;
    CHECK(rows.first >= 0 && rows.first <= rows.end && rows.end <= s.seqlen_q) << name << ": key " << j;
  }
  CHECK(ref::visible_pairs(s) == pairs) << name << ": " << ref::visible_pairs(s) << " vs " << pairs;
}

}  // namespace

// ---------------------------------------------------------------- the window's mask

TEST(window_masks_match_hand_written_matrices) {
  const struct {
    const char* name;
    AttentionShape s;
    std::vector<std::string> rows;
  } cases[] = {
      // Sq < Sk: the diagonal is j = i + 2; two keys left of it, one right.
      {"(2, 1), Sq 4 < Sk 6", shape(1, 4, 6, 1, 1, 1, 1, false, {2, 1}), {"XXXX..", ".XXXX.", "..XXXX", "...XXX"}},
      // Sq > Sk, causal with one key to the left: the diagonal j = i - 3 reaches the keys at row 3.
      {"causal, left 1, Sq 6 > Sk 3", shape(1, 6, 3, 1, 1, 1, 1, true, {1, -1}), {"...", "...", "...", "X..", "XX.", ".XX"}},
      {"(0, 0), square", shape(1, 4, 4, 1, 1, 1, 1, false, {0, 0}), {"X...", ".X..", "..X.", "...X"}},
      {"(0, 0), Sq 2 < Sk 6", shape(1, 2, 6, 1, 1, 1, 1, false, {0, 0}), {"....X.", ".....X"}},
      // Causal wins over a window_right given with it.
      {"causal with right 2", shape(1, 3, 5, 1, 1, 1, 1, true, {-1, 2}), {"XXX..", "XXXX.", "XXXXX"}},
      {"right 1 only", shape(1, 5, 5, 1, 1, 1, 1, false, {-1, 1}), {"XX...", "XXX..", "XXXX.", "XXXXX", "XXXXX"}},
      // Sq > Sk, both sides bounded: the first row's window lies wholly before the keys.
      {"(1, 1), Sq 4 > Sk 2", shape(1, 4, 2, 1, 1, 1, 1, false, {1, 1}), {"..", "X.", "XX", "XX"}},
      // Any negative bound is unbounded, not just -1.
      {"left -5, causal", shape(1, 3, 3, 1, 1, 1, 1, true, {-5, -1}), {"X..", "XX.", "XXX"}},
      // A left bound wider than the keys bounds nothing.
      {"left 9, right 0", shape(1, 3, 4, 1, 1, 1, 1, false, {9, 0}), {"XX..", "XXX.", "XXXX"}},
  };
  for (const auto& c : cases) {
    const std::vector<char> hand = mask_from_rows(c.rows);
    CHECK(mask_by_definition(c.s) == hand) << c.name << ": the test's own definition";
    check_ranges_against(c.s, hand, c.name);
  }
}

TEST(window_ranges_match_the_definition_everywhere_small) {
  // Every small combination: lengths 0..7 both ways, bounds from none to wider than the keys.
  for (int64_t sq = 0; sq <= 7; ++sq)
    for (int64_t sk = 0; sk <= 7; ++sk)
      for (int64_t left : {-1, 0, 1, 2, 3, 9})
        for (int64_t right : {-1, 0, 1, 2, 3, 9})
          for (bool causal : {false, true}) {
            const AttentionShape s = shape(1, sq, sk, 1, 1, 1, 1, causal, {left, right});
            check_ranges_against(s, mask_by_definition(s),
                                 "Sq " + std::to_string(sq) + " Sk " + std::to_string(sk) + " window (" +
                                     std::to_string(left) + ", " + std::to_string(right) + ")" +
                                     (causal ? " causal" : ""));
          }
}

TEST(window_effective_bounds_fold_causal_in) {
  namespace ref = warpattn::reference;
  const auto w = [](bool causal, int64_t left, int64_t right) {
    return ref::effective_window(shape(1, 4, 4, 1, 1, 1, 1, causal, {left, right}));
  };
  CHECK(w(false, -1, -1).left == -1 && w(false, -1, -1).right == -1);
  CHECK(w(true, -1, -1).left == -1 && w(true, -1, -1).right == 0);
  CHECK(w(true, 5, 3).left == 5 && w(true, 5, 3).right == 0);
  CHECK(w(false, 5, 3).left == 5 && w(false, 5, 3).right == 3);
  CHECK(w(false, -7, -2).left == -1 && w(false, -7, -2).right == -1);
}

TEST(window_visible_pairs_counts_the_band) {
  // Causal with 127 keys to the left (a 128-key band): rows 0..127 see i + 1 keys, the other
  // 896 rows 128 each.
  const AttentionShape s = shape(1, 1024, 1024, 1, 1, 1, 1, true, {127, -1});
  CHECK(warpattn::reference::visible_pairs(s) == 128.0 * 129 / 2 + 896.0 * 128) << warpattn::reference::visible_pairs(s);
  // Sq > Sk with (2, 2): offset -3, row i sees [i - 5, i - 1] within 3 keys.
  const AttentionShape t = shape(1, 6, 3, 1, 1, 1, 1, false, {2, 2});
  CHECK(warpattn::reference::visible_pairs(t) == 0 + 1 + 2 + 3 + 3 + 3) << warpattn::reference::visible_pairs(t);
}

// ---------------------------------------------------------------- window: values

TEST(window_reference_matches_brute_force) {
  check_against_brute_force(shape(2, 7, 7, 2, 2, 8, 0.4, false, {2, 1}), 301);
  check_against_brute_force(shape(2, 5, 9, 4, 2, 8, 0.4, true, {3, -1}), 302);   // Sq < Sk, GQA
  check_against_brute_force(shape(1, 9, 4, 3, 1, 8, 0.4, false, {1, 2}), 303);   // Sq > Sk, MQA
  check_against_brute_force(shape(1, 6, 8, 2, 2, 8, -0.6, false, {-1, 0}), 304);  // right only
  check_against_brute_force(shape(1, 6, 8, 2, 2, 8, 0.6, false, {1, -1}), 305);   // left only
  // 2 x 6 x 40 rows: several threads, each row its own band.
  check_against_brute_force(shape(2, 40, 33, 6, 3, 16, 0.25, true, {5, -1}), 306);
}

TEST(window_rows_with_no_key_get_zeros_and_negative_infinite_lse) {
  // Sq 8 > Sk 3, causal, one key to the left: rows 0..4 see nothing, rows 5..7 one or two keys.
  const AttentionShape s = shape(1, 8, 3, 2, 1, 4, 0.5, true, {1, -1});
  CHECK(check_against_brute_force(s, 310) == 5);
  const Reference r = run_reference(s, random_inputs(s, 310));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 5; ++i) {
      CHECK(std::isinf(r.lse[h * 8 + i]) && r.lse[h * 8 + i] < 0) << "row " << i;
      for (int64_t d = 0; d < 4; ++d) CHECK(r.out[(i * 2 + h) * 4 + d] == 0.0) << "row " << i;
    }
  // Both sides bounded with Sq > Sk: rows 0..2 empty (the right bound), the rest one or two keys.
  CHECK(check_against_brute_force(shape(2, 6, 2, 2, 2, 4, 0.5, false, {1, 1}), 311) == 3);
}

TEST(window_left_0_right_0_returns_the_diagonal_value) {
  // One key per row: the softmax is 1 on it, so out is exactly that key's v and lse its logit.
  const AttentionShape s = shape(1, 3, 5, 1, 1, 4, 0.5, false, {0, 0});
  const Inputs in = random_inputs(s, 320);
  const Reference r = run_reference(s, in);
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t j = i + 2;
    double dot = 0;
    for (int64_t d = 0; d < 4; ++d) dot += double(in.q[i * 4 + d]) * double(in.k[j * 4 + d]);
    CHECK(std::fabs(r.lse[i] - 0.5 * dot) < 1e-15) << "row " << i << ": " << r.lse[i] << " vs " << 0.5 * dot;
    for (int64_t d = 0; d < 4; ++d) CHECK(r.out[i * 4 + d] == double(in.v[j * 4 + d])) << "row " << i << " d " << d;
  }
  check_against_brute_force(shape(2, 5, 3, 2, 1, 8, 0.5, false, {0, 0}), 321);  // Sq > Sk: rows 0, 1 empty
}

// ---------------------------------------------------------------- soft cap

TEST(softcap_reference_matches_direct_evaluation) {
  check_against_brute_force(shape(2, 5, 7, 2, 2, 8, 0.5, false, {-1, -1, 1.5}), 330);
  check_against_brute_force(shape(2, 6, 6, 4, 2, 8, 0.5, true, {-1, -1, 0.7}), 331);
  // Raw scaled scores of about +-1600 (exp would overflow double), capped to +-30.
  check_against_brute_force(shape(1, 6, 7, 2, 2, 8, 200.0, false, {-1, -1, 30.0}), 332);
  check_against_brute_force(shape(1, 4, 9, 2, 1, 8, -0.8, true, {-1, -1, 5.0}), 333);
}

TEST(softcap_logits_are_bounded_by_the_cap) {
  // With a cap of 1 and huge raw scores every logit is in [-1, 1]: each lse lies within
  // [log(n) - 1, log(n) + 1] for the n keys the row sees.
  const AttentionShape s = shape(1, 5, 6, 1, 1, 8, 500.0, true, {-1, -1, 1.0});
  const Reference r = run_reference(s, random_inputs(s, 334));
  for (int64_t i = 0; i < 5; ++i) {
    const double n = double(i + 2);
    CHECK(r.lse[i] >= std::log(n) - 1 - 1e-12 && r.lse[i] <= std::log(n) + 1 + 1e-12) << "row " << i << ": " << r.lse[i];
  }
}

TEST(softcap_very_large_equals_no_softcap) {
  // c tanh(x / c) = x - x^3 / (3 c^2) + ...: with |x| < 3 and c = 1e7 that is 1e-13 off x.
  const AttentionShape plain = shape(2, 6, 9, 4, 2, 8, 0.5, true);
  AttentionShape capped = plain;
  capped.softcap = 1e7;
  const Inputs in = random_inputs(plain, 340, true);
  const Reference a = run_reference(plain, in), b = run_reference(capped, in);
  double worst = 0;
  for (size_t e = 0; e < a.out.size(); ++e) worst = std::max(worst, std::fabs(a.out[e] - b.out[e]));
  for (size_t e = 0; e < a.lse.size(); ++e) worst = std::max(worst, std::fabs(a.lse[e] - b.lse[e]));
  CHECK(worst < 1e-12) << worst;
  // And a cap does change them when it is small (so the comparison above is not vacuous).
  capped.softcap = 0.5;
  const Reference c = run_reference(capped, in);
  double moved = 0;
  for (size_t e = 0; e < a.lse.size(); ++e) moved = std::max(moved, std::fabs(a.lse[e] - c.lse[e]));
  CHECK(moved > 1e-2) << moved;
}

// ---------------------------------------------------------------- sinks

TEST(sinks_match_brute_force) {
  check_against_brute_force(shape(2, 5, 7, 3, 3, 8, 0.5, false), 350, true);
  check_against_brute_force(shape(2, 6, 6, 4, 2, 8, 0.5, true), 351, true);
  check_against_brute_force(shape(1, 8, 3, 4, 1, 8, 0.5, true), 352, true);  // rows 0..4 see only the sink
}

TEST(sinks_of_minus_1e30_equal_no_sinks) {
  // exp(-1e30 - max) is exactly 0: the same bits as no sink wherever a row sees a key. A row
  // that sees none takes the sink as its LSE, as any sink: -1e30 there, not -inf (the rule has
  // no threshold below which a finite sink stops counting). A sink of -inf is no sink at all.
  const AttentionShape s = shape(2, 7, 5, 4, 2, 8, 0.5, true, {2, -1, 3.0});  // rows 0, 1 see no key
  Inputs in = random_inputs(s, 360);
  const Reference none = run_reference(s, in);
  in.sinks.assign(4, -1e30f);
  const Reference tiny = run_reference(s, in);
  CHECK(tiny.out == none.out);
  int64_t empty = 0;
  for (size_t r = 0; r < none.lse.size(); ++r) {
    if (std::isinf(none.lse[r])) {
      ++empty;
      CHECK(tiny.lse[r] == double(-1e30f)) << r << ": " << tiny.lse[r];
    } else {
      CHECK(tiny.lse[r] == none.lse[r]) << r << ": " << tiny.lse[r] << " vs " << none.lse[r];
    }
  }
  CHECK(empty == 2 * 4 * 2) << empty;
  in.sinks.assign(4, -std::numeric_limits<float>::infinity());
  const Reference minus_inf = run_reference(s, in);
  CHECK(minus_inf.out == none.out && minus_inf.lse == none.lse);
}

TEST(sinks_rows_with_no_key_get_the_sink_as_lse_and_zero_out) {
  // Sq 8 > Sk 3, causal: rows 0..4 of every head see no key, only the sink.
  const AttentionShape s = shape(2, 8, 3, 2, 1, 4, 0.5, true);
  const Inputs in = random_inputs(s, 370, true);
  const Reference r = run_reference(s, in);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 5; ++i) {
        CHECK(r.lse[(b * 2 + h) * 8 + i] == double(in.sinks[h])) << b << " " << h << " " << i << ": " << r.lse[(b * 2 + h) * 8 + i];
        for (int64_t d = 0; d < 4; ++d) CHECK(r.out[((b * 8 + i) * 2 + h) * 4 + d] == 0.0) << b << " " << h << " " << i;
      }
  // The same through attention_row and the fp32 row.
  double out[4], lse;
  warpattn::reference::attention_row(bound(s, in), in.q.data(), in.k.data(), in.v.data(), 1, 1, 2, out, &lse);
  CHECK(lse == double(in.sinks[1]) && out[0] == 0 && out[3] == 0) << lse;
  float out32[4], lse32;
  warpattn::reference::attention_row_fp32(bound(s, in), in.q.data(), in.k.data(), in.v.data(), 1, 1, 2, out32, &lse32);
  CHECK(lse32 == in.sinks[1] && out32[0] == 0 && out32[3] == 0) << lse32;
}

TEST(sinks_take_their_share_from_every_key_alike) {
  // With the sink's weight w_i = exp(sink - L_i): sum_j P_ij + w_i = 1, each P_ij is the
  // sinkless P_ij times (1 - w_i), so out_i is the sinkless out_i times (1 - w_i), and
  // L_i = log(exp(L_i without) + exp(sink)).
  const AttentionShape s = shape(1, 6, 9, 2, 1, 8, 0.6, false, {3, 1, 2.0});
  const Inputs with_in = random_inputs(s, 380, true);
  Inputs without_in = with_in;
  without_in.sinks.clear();
  const Reference with = run_reference(s, with_in), without = run_reference(s, without_in);
  const std::vector<char> mask = mask_by_definition(s);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 6; ++i) {
      const double L = with.lse[h * 6 + i], sink = with_in.sinks[h];
      const double w = std::exp(sink - L);
      double p_sum = 0;
      for (int64_t j = 0; j < 9; ++j) {
        if (!mask[i * 9 + j]) continue;
        double dot = 0;
        for (int64_t d = 0; d < 8; ++d) dot += double(with_in.q[(i * 2 + h) * 8 + d]) * double(with_in.k[j * 8 + d]);
        p_sum += std::exp(2.0 * std::tanh(0.6 * dot / 2.0) - L);
      }
      CHECK(std::fabs(p_sum + w - 1) < 1e-14) << h << " " << i << ": " << p_sum << " + " << w;
      CHECK(w > 0.01) << "the sink should take a real share: " << w;
      const double L_without = without.lse[h * 6 + i];
      CHECK(std::fabs(L - std::log(std::exp(L_without) + std::exp(sink))) < 1e-14) << h << " " << i;
      for (int64_t d = 0; d < 8; ++d) {
        const int64_t e = (i * 2 + h) * 8 + d;
        CHECK(std::fabs(with.out[e] - without.out[e] * (1 - w)) < 1e-14) << h << " " << i << " " << d;
      }
    }
}

TEST(sinks_far_above_the_logits_do_not_overflow) {
  // exp(1000) overflows double; the sink takes part in the row maximum, so nothing does here:
  // L = 1000 + log(1 + sum exp(t - 1000)) = 1000 to the last bit and out is about exp(-1000) = 0.
  const AttentionShape s = shape(1, 3, 4, 1, 1, 8, 0.5, false);
  Inputs in = random_inputs(s, 390);
  in.sinks = {1000.f};
  const Reference r = run_reference(s, in);
  for (double x : r.lse) CHECK(x == 1000.0) << x;
  for (double x : r.out) CHECK(std::isfinite(x) && std::fabs(x) < 1e-300) << x;
}

// ---------------------------------------------------------------- everything at once

TEST(features_combined_match_brute_force) {
  // Window x causal x GQA x soft cap x sinks, Sq < Sk and Sq > Sk, rows with no key.
  check_against_brute_force(shape(2, 5, 9, 4, 2, 8, 0.5, true, {2, -1, 1.5}), 400, true);
  check_against_brute_force(shape(2, 9, 4, 4, 2, 8, 0.5, true, {1, -1, 1.5}), 401, true);
  check_against_brute_force(shape(1, 9, 5, 6, 2, 8, 0.5, false, {1, 2, 3.0}), 402, true);
  check_against_brute_force(shape(1, 7, 11, 3, 1, 6, -0.7, false, {0, 3, 0.8}), 403, true);
  check_against_brute_force(shape(2, 40, 33, 6, 3, 16, 0.25, true, {6, -1, 2.0}), 404, true);
}

TEST(fp32_reference_with_features_is_close_to_fp64) {
  const AttentionShape s = shape(1, 16, 512, 2, 1, 128, 1 / std::sqrt(128.0), true, {100, -1, 5.0});
  const Inputs in = random_inputs(s, 410, true);
  const Reference want = run_reference(s, in);
  std::vector<float> out(want.out.size()), lse(want.lse.size());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 16; ++i)
      warpattn::reference::attention_row_fp32(bound(s, in), in.q.data(), in.k.data(), in.v.data(), 0, h, i,
                                              &out[(i * 2 + h) * 128], &lse[h * 16 + i]);
  const auto out_err = warpattn::reference::compare(out.data(), want.out.data(), int64_t(out.size()));
  const auto lse_err = warpattn::reference::compare(lse.data(), want.lse.data(), int64_t(lse.size()));
  CHECK(out_err.rel_l2 < 1e-5 && out_err.rel_l2 > 0) << "out rel_l2 " << out_err.rel_l2;
  CHECK(lse_err.rel_l2 < 1e-6) << "lse rel_l2 " << lse_err.rel_l2;
}

TEST(attention_row_with_spread_takes_the_features_too) {
  // The spread's row is attention_row's, bit for bit, with every feature on.
  const AttentionShape s = shape(1, 6, 8, 2, 1, 8, 0.5, true, {2, -1, 1.5});
  const Inputs in = random_inputs(s, 420, true);
  const Reference all = run_reference(s, in);
  double row[8], spread[8], lse;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 6; ++i) {
      warpattn::reference::attention_row_with_spread(bound(s, in), in.q.data(), in.k.data(), in.v.data(), 0, h, i,
                                                     row, &lse, spread);
      CHECK(lse == all.lse[h * 6 + i]) << h << " " << i;
      for (int64_t d = 0; d < 8; ++d) CHECK(row[d] == all.out[(i * 2 + h) * 8 + d] && spread[d] >= 0) << h << " " << i;
    }
}
