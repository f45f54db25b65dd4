// The fp64 reference backward checked three independent ways:
//   1. against finite differences of the forward reference (the definition of a gradient: if
//      these agree, the formulas and the code implementing them are right, whatever they are);
//   2. against a brute force written out from the formulas (whole P and dP matrices in long
//      double, GQA expanded, D as rowsum(P * dP) rather than dO * O), which also gives the
//      spreads and runs shapes too large or too ill-conditioned for finite differences;
//   3. against identities every correct gradient satisfies.
// The finite-difference comparison is shown to catch planted faults (D's sign, a dropped key, a
// wrong GQA head, a missing scale, the wrong causal alignment; for the features of issue 19 a
// window one key too wide, the soft cap's 1 - tanh^2 left out of dS, the sink left out of the
// LSE, dsinks' sign) by feeding it the brute force with each fault switched on. The features
// (sliding window, soft cap, sinks and their dsinks) go through all of it: the brute force
// writes the mask out from FlashAttention's definition, the cap as its formula, the sink as one
// more term of the row sum, and the finite differences perturb each sink like any input.
//
// Why the finite differences can be tight: inputs are multiples of 2^-12 in [-1, 1] and the
// steps are 2^-8 and 2^-9, so x +- step is exactly representable in float and the forward
// reference (which takes floats) sees exactly the intended perturbation; each loss is
// evaluated in fp64 over only the rows the perturbed input reaches (the rest of L does not
// move and would only add rounding); and two central differences are combined by Richardson
// extrapolation, (4 c(h/2) - c(h)) / 3, which cancels the h^2 truncation term. What remains is
// O(h^4) truncation and about 1e-16 / h rounding: measured 5e-13 to 1.2e-11 of each tensor's
// largest gradient on these shapes (WARPATTN_PRINT_AGREEMENT=1 prints it), 1.8e-10 for a soft
// cap of 0.6 on scores of several caps (tanh's higher derivatives swell the h^4 term), so a
// tolerance of 1e-8 is robust by 50x at worst and nearly 1000x elsewhere, while the planted
// faults move gradients by 0.49 to 6.6 of that size, 10^7 times the tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "reference/reference.hpp"
#include "reference_brute_force.hpp"

namespace {

// Shapes with the features of issue 19 are built as in the forward tests
// (reference_brute_force.hpp); the inputs here are the backward's own (grid values, dout).
using reference_test::AttentionShape;
using reference_test::Real;
using reference_test::shape;

// Multiples of 2^-12 in [-1, 1]: exact in float with room for a 2^-9 step either side.
std::vector<float> grid_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-4096, 4096);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& x : values) x = std::ldexp(float(dist(rng)), -12);
  return values;
}

struct Inputs {
  std::vector<float> q, k, v, dout;
  std::vector<float> sinks;  // [Hq], empty for none
};

int64_t q_size(const AttentionShape& s) { return s.batch * s.seqlen_q * s.heads_q * s.head_dim; }
int64_t kv_size(const AttentionShape& s) { return s.batch * s.seqlen_k * s.heads_kv * s.head_dim; }

Inputs random_inputs(const AttentionShape& s, uint64_t seed, bool with_sinks = false) {
  return {grid_values(q_size(s), seed), grid_values(kv_size(s), seed + 1),
          grid_values(kv_size(s), seed + 2), grid_values(q_size(s), seed + 3),
          with_sinks ? grid_values(s.heads_q, seed + 4) : std::vector<float>{}};
}

// The shape the reference is given: s with its sinks pointing into `in` (none if it has none).
// Tests pass shapes without sinks and bind them here, so a copy of the inputs (the finite
// differences perturb one) carries its own.
AttentionShape bound(AttentionShape s, const Inputs& in) {
  s.sinks = in.sinks.empty() ? nullptr : in.sinks.data();
  return s;
}

struct Grads {
  std::vector<double> dq, dk, dv;
  std::vector<double> dsinks;                           // [Hq], empty without sinks
  std::vector<double> dq_spread, dk_spread, dv_spread;  // empty when not computed
};

// The reference under test. Outputs start as NaN so that an element it fails to write shows.
Grads run_reference(const AttentionShape& s, const Inputs& in, bool with_spreads = true) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Grads g;
  g.dq.assign(size_t(q_size(s)), nan);
  g.dk.assign(size_t(kv_size(s)), nan);
  g.dv.assign(size_t(kv_size(s)), nan);
  warpattn::reference::BackwardSpreads spreads;
  if (with_spreads) {
    g.dq_spread.assign(g.dq.size(), nan);
    g.dk_spread.assign(g.dk.size(), nan);
    g.dv_spread.assign(g.dv.size(), nan);
    spreads = {g.dq_spread.data(), g.dk_spread.data(), g.dv_spread.data()};
  }
  // dsinks is asked for with sinks only; without them it must be zeros (a test below).
  if (!in.sinks.empty()) g.dsinks.assign(size_t(s.heads_q), nan);
  warpattn::reference::attention_backward(bound(s, in), in.q.data(), in.k.data(), in.v.data(),
                                          in.dout.data(), g.dq.data(), g.dk.data(), g.dv.data(),
                                          spreads, g.dsinks.empty() ? nullptr : g.dsinks.data());
  return g;
}

// ---------------------------------------------------------------- brute force, with faults

enum class Fault {
  kNone,
  kFlipDeltaSign,   // dS = P (dP + D)
  kDropLastKey,     // key Sk-1 left out of every backward sum
  kGqaHeadModulo,   // query head h reads kv head h % Hkv instead of h / (Hq / Hkv)
  kUnscaledDq,      // dQ = dS K, the scale forgotten
  kTopLeftCausal,   // causal mask aligned top-left (j <= i) instead of bottom-right
  kWideWindow,      // window_left one key wider than asked
  kNoCapSlope,      // dS without the soft cap's factor 1 - tanh^2
  kSinkOutsideLse,  // the sink left out of the backward's LSE (P normalised over the keys)
  kSinkGradientSign,  // dsink = +sum exp(sink - L) D
};

Grads brute_force(const AttentionShape& s, const Inputs& in, Fault fault = Fault::kNone) {
  const int64_t B = s.batch, Sq = s.seqlen_q, Sk = s.seqlen_k, Hq = s.heads_q, Hkv = s.heads_kv;
  const int64_t D = s.head_dim, group = Hq / Hkv;
  const Real scale = s.softmax_scale, cap = s.softcap;
  const Real dq_scale = fault == Fault::kUnscaledDq ? Real(1) : scale;
  // The mask from FlashAttention's definition: with the diagonal at j = i + offset, row i sees
  // j iff j >= i + offset - left (left >= 0) and j <= i + offset + right (right >= 0), causal
  // meaning right = 0.
  const int64_t offset = fault == Fault::kTopLeftCausal ? 0 : Sk - Sq;
  const int64_t left = s.window_left < 0 ? -1 : s.window_left + (fault == Fault::kWideWindow ? 1 : 0);
  const int64_t right = s.causal ? 0 : s.window_right;
  auto sees = [&](int64_t i, int64_t j) {
    return (left < 0 || j >= i + offset - left) && (right < 0 || j <= i + offset + right);
  };
  auto Q = [&](int64_t b, int64_t i, int64_t h, int64_t d) {
    return Real(in.q[((b * Sq + i) * Hq + h) * D + d]);
  };
  auto dO = [&](int64_t b, int64_t i, int64_t h, int64_t d) {
    return Real(in.dout[((b * Sq + i) * Hq + h) * D + d]);
  };
  auto kv_index = [&](int64_t b, int64_t j, int64_t hk, int64_t d) { return ((b * Sk + j) * Hkv + hk) * D + d; };

  std::vector<Real> dq(size_t(q_size(s))), dq_sq(dq.size());
  std::vector<Real> dk(size_t(kv_size(s))), dv(dk.size()), dk_sq(dk.size()), dv_sq(dk.size());
  std::vector<Real> dsinks(in.sinks.size());
  std::vector<Real> P(size_t(Sq * Sk)), dP(P.size()), dS(P.size()), slope(P.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = fault == Fault::kGqaHeadModulo ? h % Hkv : h / group;
      auto K = [&](int64_t j, int64_t d) { return Real(in.k[kv_index(b, j, hk, d)]); };
      auto V = [&](int64_t j, int64_t d) { return Real(in.v[kv_index(b, j, hk, d)]); };
      const bool with_sink = !in.sinks.empty();
      const Real sink_weight = with_sink ? std::exp(Real(in.sinks[h])) : Real(0);  // exp(sink)
      for (int64_t i = 0; i < Sq; ++i) {
        // exp without a maximum subtracted: long double's range covers these logits. The sink's
        // exp(sink) joins the sum and takes the weight exp(sink - L) = exp(sink) / sum.
        Real sum = fault == Fault::kSinkOutsideLse ? Real(0) : sink_weight;
        for (int64_t j = 0; j < Sk; ++j) {
          Real dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += Q(b, i, h, d) * K(j, d);
          // t = cap tanh(scale x / cap), dt/d(scale x) = 1 - tanh^2; t = scale x, 1 without.
          const Real tanh_arg = cap > 0 ? std::tanh(scale * dot / cap) : Real(0);
          const Real t = cap > 0 ? cap * tanh_arg : scale * dot;
          slope[i * Sk + j] = cap > 0 && fault != Fault::kNoCapSlope ? 1 - tanh_arg * tanh_arg : Real(1);
          P[i * Sk + j] = sees(i, j) ? std::exp(t) : Real(0);
          sum += P[i * Sk + j];
        }
        for (int64_t j = 0; j < Sk; ++j) P[i * Sk + j] = sum > 0 ? P[i * Sk + j] / sum : Real(0);
        Real delta = 0;  // rowsum(P * dP), where the reference uses dO * O
        for (int64_t j = 0; j < Sk; ++j) {
          Real dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += dO(b, i, h, d) * V(j, d);
          dP[i * Sk + j] = dp;
          delta += P[i * Sk + j] * dp;
        }
        // dsink = -sum_i exp(sink - L_i) D_i: the sink's weight times the row's D.
        if (with_sink && sum > 0)
          dsinks[h] += (fault == Fault::kSinkGradientSign ? 1 : -1) * (sink_weight / sum) * delta;
        if (fault == Fault::kFlipDeltaSign) delta = -delta;
        for (int64_t j = 0; j < Sk; ++j)
          dS[i * Sk + j] = P[i * Sk + j] * (dP[i * Sk + j] - delta) * slope[i * Sk + j];
      }
      const int64_t keys = fault == Fault::kDropLastKey ? Sk - 1 : Sk;
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t d = 0; d < D; ++d) {
          Real acc = 0, acc_sq = 0;
          for (int64_t j = 0; j < keys; ++j) {
            const Real term = dq_scale * dS[i * Sk + j] * K(j, d);
            acc += term;
            acc_sq += term * term;
          }
          dq[((b * Sq + i) * Hq + h) * D + d] = acc;
          dq_sq[((b * Sq + i) * Hq + h) * D + d] = acc_sq;
        }
      for (int64_t j = 0; j < keys; ++j)
        for (int64_t d = 0; d < D; ++d)
          for (int64_t i = 0; i < Sq; ++i) {
            const Real k_term = scale * dS[i * Sk + j] * Q(b, i, h, d);
            const Real v_term = P[i * Sk + j] * dO(b, i, h, d);
            dk[kv_index(b, j, hk, d)] += k_term;
            dk_sq[kv_index(b, j, hk, d)] += k_term * k_term;
            dv[kv_index(b, j, hk, d)] += v_term;
            dv_sq[kv_index(b, j, hk, d)] += v_term * v_term;
          }
    }
  auto to_double = [](const std::vector<Real>& x, bool root) {
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = double(root ? std::sqrt(x[i]) : x[i]);
    return y;
  };
  Grads g{to_double(dq, false), to_double(dk, false), to_double(dv, false), to_double(dsinks, false),
          to_double(dq_sq, true), to_double(dk_sq, true), to_double(dv_sq, true)};
  return g;
}

// ---------------------------------------------------------------- finite differences

// sum_d out_id dout_id for one row (b, h, i), out by the forward reference.
double row_loss(const AttentionShape& s, const Inputs& in, int64_t b, int64_t h, int64_t i) {
  std::vector<double> out(size_t(s.head_dim));
  warpattn::reference::attention_row(bound(s, in), in.q.data(), in.k.data(), in.v.data(), b, h, i,
                                     out.data(), nullptr);
  const float* dout = in.dout.data() + ((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim;
  double loss = 0;
  for (int64_t d = 0; d < s.head_dim; ++d) loss += out[d] * double(dout[d]);
  return loss;
}

// dL/dx by Richardson-extrapolated central differences; `loss` evaluates the part of L that x
// reaches. x is restored afterwards.
template <class Loss>
double derivative(float& x, const Loss& loss) {
  const float x0 = x;
  auto central = [&](float step) {
    x = x0 + step;  // exact: x0 and step are multiples of 2^-12 of magnitude <= 1
    const double up = loss();
    x = x0 - step;
    const double down = loss();
    x = x0;
    return (up - down) / (2.0 * double(step));
  };
  const double coarse = central(std::ldexp(1.f, -8)), fine = central(std::ldexp(1.f, -9));
  return (4 * fine - coarse) / 3;
}

Grads finite_differences(const AttentionShape& s, Inputs in) {
  const int64_t Sq = s.seqlen_q, Sk = s.seqlen_k, Hq = s.heads_q, Hkv = s.heads_kv, D = s.head_dim;
  const int64_t group = Hq / Hkv;
  Grads g;
  g.dq.resize(size_t(q_size(s)));
  g.dk.resize(size_t(kv_size(s)));
  g.dv.resize(size_t(kv_size(s)));
  // q_{b,i,h,d} reaches only row (b, h, i).
  for (int64_t e = 0; e < q_size(s); ++e) {
    const int64_t h = (e / D) % Hq, i = (e / (D * Hq)) % Sq, b = e / (D * Hq * Sq);
    g.dq[e] = derivative(in.q[e], [&] { return row_loss(s, in, b, h, i); });
  }
  // k and v of (b, kv head) reach every row of the group's query heads in batch b.
  for (int64_t e = 0; e < kv_size(s); ++e) {
    const int64_t hk = (e / D) % Hkv, b = e / (D * Hkv * Sk);
    auto group_loss = [&] {
      double loss = 0;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t i = 0; i < Sq; ++i) loss += row_loss(s, in, b, h, i);
      return loss;
    };
    g.dk[e] = derivative(in.k[e], group_loss);
    g.dv[e] = derivative(in.v[e], group_loss);
  }
  // sink h reaches every row of query head h, in every batch.
  g.dsinks.resize(in.sinks.size());
  for (int64_t h = 0; h < int64_t(in.sinks.size()); ++h)
    g.dsinks[h] = derivative(in.sinks[h], [&] {
      double loss = 0;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t i = 0; i < Sq; ++i) loss += row_loss(s, in, b, h, i);
      return loss;
    });
  return g;
}

// ---------------------------------------------------------------- comparison

// The worst element of dq, dk and dv: |got - want| relative to the largest |want| of its
// tensor (an absolute error is what finite differences make, and gradients near zero would
// make a per-element relative error meaningless).
struct Agreement {
  double worst = 0;
  std::string where = "none";
};

void agree(const char* name, const std::vector<double>& got, const std::vector<double>& want,
           Agreement& a) {
  if (got.size() != want.size()) {
    a.worst = std::numeric_limits<double>::infinity();
    a.where = std::string(name) + ": " + std::to_string(got.size()) + " values, want " + std::to_string(want.size());
    return;
  }
  double largest = 0;
  for (double w : want) largest = std::max(largest, std::fabs(w));
  if (largest == 0) largest = 1;  // all zero: then any nonzero got is an absolute error
  for (size_t e = 0; e < want.size(); ++e) {
    const double error = std::fabs(got[e] - want[e]) / largest;  // NaN got: caught below
    if (!(error <= a.worst)) {
      a.worst = std::isnan(error) ? std::numeric_limits<double>::infinity() : error;
      a.where = std::string(name) + "[" + std::to_string(e) + "] = " + std::to_string(got[e]) +
                ", want " + std::to_string(want[e]);
    }
  }
}

Agreement agreement(const Grads& got, const Grads& want) {
  Agreement a;
  agree("dq", got.dq, want.dq, a);
  agree("dk", got.dk, want.dk, a);
  agree("dv", got.dv, want.dv, a);
  agree("dsinks", got.dsinks, want.dsinks, a);
  return a;
}

Agreement spread_agreement(const Grads& got, const Grads& want) {
  Agreement a;
  agree("dq_spread", got.dq_spread, want.dq_spread, a);
  agree("dk_spread", got.dk_spread, want.dk_spread, a);
  agree("dv_spread", got.dv_spread, want.dv_spread, a);
  return a;
}

constexpr double kFiniteDifferenceTolerance = 1e-8;  // measured: at most 1.2e-11
constexpr double kBruteForceTolerance = 1e-12;       // fp64 against long double, tiny sums

// Gradients large enough that agreeing with them means something.
void check_not_trivial(const Grads& g) {
  for (const auto* t : {&g.dq, &g.dk, &g.dv, &g.dsinks}) {
    if (t->empty()) continue;  // no sinks
    double largest = 0;
    for (double x : *t) largest = std::max(largest, std::fabs(x));
    CHECK(largest > 1e-2) << "a gradient tensor is (nearly) zero: " << largest;
  }
}

// The full check of one shape: reference against finite differences and brute force.
void check_shape(const AttentionShape& s, uint64_t seed, bool with_sinks = false) {
  const Inputs in = random_inputs(s, seed, with_sinks);
  const Grads got = run_reference(s, in);
  check_not_trivial(got);
  const Agreement fd = agreement(got, finite_differences(s, in));
  CHECK(fd.worst <= kFiniteDifferenceTolerance) << fd.worst << " at " << fd.where;
  if (std::getenv("WARPATTN_PRINT_AGREEMENT"))
    std::printf("    finite differences: worst %.3g relative to the tensor's largest\n", fd.worst);
  const Grads brute = brute_force(s, in);
  const Agreement bf = agreement(got, brute);
  CHECK(bf.worst <= kBruteForceTolerance) << bf.worst << " at " << bf.where;
  const Agreement sp = spread_agreement(got, brute);
  CHECK(sp.worst <= kBruteForceTolerance) << sp.worst << " at " << sp.where;
}

}  // namespace

// ---------------------------------------------------------------- against finite differences

TEST(backward_matches_finite_differences_non_causal) {
  check_shape(shape(2, 5, 7, 3, 3, 8, 1 / std::sqrt(8.0), false), 101);
}

TEST(backward_matches_finite_differences_causal_square) {
  check_shape(shape(2, 6, 6, 2, 2, 8, 0.35, true), 102);
}

TEST(backward_matches_finite_differences_causal_fewer_queries_than_keys) {
  check_shape(shape(1, 3, 8, 2, 2, 16, 0.35, true), 103);
}

TEST(backward_matches_finite_differences_causal_more_queries_than_keys) {
  // Rows 0..4 see no key (bottom-right: row i sees keys j <= i - 5).
  check_shape(shape(1, 8, 3, 2, 2, 8, 0.5, true), 104);
  check_shape(shape(1, 8, 3, 2, 2, 8, 0.5, false), 105);
}

TEST(backward_matches_finite_differences_gqa) {
  check_shape(shape(2, 5, 6, 4, 2, 8, 0.4, false), 106);
  check_shape(shape(2, 5, 6, 4, 2, 8, 0.4, true), 107);
}

TEST(backward_matches_finite_differences_mqa) {
  check_shape(shape(2, 5, 6, 4, 1, 8, 0.4, false), 108);
  check_shape(shape(1, 6, 4, 4, 1, 16, 0.4, true), 109);
}

TEST(backward_matches_finite_differences_other_scales) {
  for (double scale : {1.3, -0.7, 0.05}) check_shape(shape(1, 4, 5, 2, 1, 16, scale, true), 110);
}

// ---------------------------------------------------------------- the features of issue 19

TEST(backward_matches_finite_differences_window) {
  check_shape(shape(2, 7, 7, 2, 2, 8, 0.5, false, {2, 1}), 180);
  check_shape(shape(1, 5, 9, 4, 2, 8, 0.5, true, {3, -1}), 181);  // Sq < Sk, GQA
  // Sq > Sk, both sides bounded: rows 0..2 see no key, the rest one or two.
  check_shape(shape(2, 6, 2, 2, 1, 8, 0.5, false, {1, 1}), 182);
  check_shape(shape(1, 6, 8, 2, 2, 8, 0.5, false, {1, 0}), 183);  // two keys per row
}

TEST(backward_window_0_0_routes_dout_to_the_diagonal_value) {
  // One key per row: P_ii' = 1 whatever q and k are, so dq = dk = 0 exactly, and dv of the
  // row's key is its dO (summed over the group's heads); keys no row sees get zeros.
  const AttentionShape s = shape(1, 4, 6, 2, 1, 8, 0.5, false, {0, 0});  // row i sees key i + 2
  const Inputs in = random_inputs(s, 188);
  const Grads g = run_reference(s, in);
  for (double x : g.dq) CHECK(x == 0.0) << x;
  for (double x : g.dk) CHECK(x == 0.0) << x;
  for (int64_t j = 0; j < 6; ++j)
    for (int64_t d = 0; d < 8; ++d) {
      const double want = j < 2 ? 0.0 : double(in.dout[((j - 2) * 2 + 0) * 8 + d]) + double(in.dout[((j - 2) * 2 + 1) * 8 + d]);
      CHECK(g.dv[j * 8 + d] == want) << "key " << j << " d " << d << ": " << g.dv[j * 8 + d] << " vs " << want;
    }
}

TEST(backward_matches_finite_differences_softcap) {
  check_shape(shape(2, 5, 7, 2, 2, 8, 0.5, false, {-1, -1, 1.5}), 184);
  // Raw scaled scores of several caps: tanh well into its bend, 1 - tanh^2 far from 1.
  check_shape(shape(1, 6, 6, 4, 2, 16, 1.3, true, {-1, -1, 0.6}), 185);
}

TEST(backward_matches_finite_differences_sinks) {
  check_shape(shape(2, 5, 7, 3, 3, 8, 0.5, false), 186, true);
  check_shape(shape(1, 8, 3, 4, 2, 8, 0.5, true), 187, true);  // rows 0..4 see only the sink
}

TEST(backward_matches_finite_differences_all_features_with_gqa) {
  // Soft cap, window, causal, sinks and GQA together, Sq < Sk and Sq > Sk (rows with no key),
  // and a window on both sides without causal.
  check_shape(shape(2, 5, 9, 4, 2, 8, 0.6, true, {2, -1, 1.2}), 190, true);
  check_shape(shape(1, 9, 5, 4, 2, 8, 0.6, true, {1, -1, 1.2}), 191, true);
  check_shape(shape(1, 7, 7, 6, 2, 8, -0.8, false, {1, 2, 0.9}), 192, true);
}

TEST(backward_without_sinks_gives_zero_dsinks) {
  // Asked for without sinks (or with sinks of -inf: no weight), dsinks is zeros, and nothing
  // else moves.
  const AttentionShape s = shape(1, 6, 5, 2, 1, 8, 0.5, true, {1, -1, 2.0});
  Inputs in = random_inputs(s, 195);
  const Grads plain = run_reference(s, in, false);
  std::vector<double> dq(plain.dq.size()), dk(plain.dk.size()), dv(plain.dv.size()), dsinks(2, 1.0);
  warpattn::reference::attention_backward(s, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), dq.data(),
                                          dk.data(), dv.data(), {}, dsinks.data());
  CHECK(dsinks[0] == 0.0 && dsinks[1] == 0.0) << dsinks[0] << " " << dsinks[1];
  CHECK(dq == plain.dq && dk == plain.dk && dv == plain.dv);
  in.sinks.assign(2, -std::numeric_limits<float>::infinity());
  const Grads minus_inf = run_reference(s, in, false);
  CHECK(minus_inf.dsinks == std::vector<double>(2, 0.0)) << minus_inf.dsinks[0] << " " << minus_inf.dsinks[1];
  CHECK(minus_inf.dq == plain.dq && minus_inf.dk == plain.dk && minus_inf.dv == plain.dv);
  // No rows at all: dsinks is still written, zeros.
  const AttentionShape empty = shape(0, 6, 5, 2, 1, 8, 0.5, false);
  dsinks.assign(2, 1.0);
  warpattn::reference::attention_backward(empty, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, {},
                                          dsinks.data());
  CHECK(dsinks[0] == 0.0 && dsinks[1] == 0.0);
}

// ---------------------------------------------------------------- planted faults

// The same comparison, fed gradients with a known bug, must fail, each by a wide margin; the
// faultless brute force through the same path must pass (so it is the fault that fails).
namespace {
struct NamedFault {
  Fault fault;
  const char* name;
};

// The faultless brute force against the finite differences first, then each fault in turn.
void check_faults(const AttentionShape& s, const Inputs& in, const std::vector<NamedFault>& faults) {
  const Grads fd = finite_differences(s, in);
  const Agreement clean = agreement(brute_force(s, in), fd);
  CHECK(clean.worst <= kFiniteDifferenceTolerance) << clean.worst << " at " << clean.where;
  for (const auto& f : faults) {
    const Agreement bad = agreement(brute_force(s, in, f.fault), fd);
    // At least 1000 x the tolerance: the check does not pass such bugs by a hair.
    CHECK(bad.worst > 1000 * kFiniteDifferenceTolerance) << f.name << ": only " << bad.worst;
    if (std::getenv("WARPATTN_PRINT_AGREEMENT"))
      std::printf("    %s: worst %.3g\n", f.name, bad.worst);
  }
}
}  // namespace

TEST(finite_difference_check_catches_planted_faults) {
  // Causal, Sq > Sk (rows without keys, alignment matters), GQA with two kv heads (h / 2 and
  // h % 2 differ), a non-default scale.
  const AttentionShape s = shape(2, 6, 5, 4, 2, 8, 0.45, true);
  const Inputs in = random_inputs(s, 111);
  check_faults(s, in, {{Fault::kFlipDeltaSign, "D's sign flipped"},
                       {Fault::kDropLastKey, "last key dropped"},
                       {Fault::kGqaHeadModulo, "GQA head h % Hkv"},
                       {Fault::kUnscaledDq, "dQ without the scale"},
                       {Fault::kTopLeftCausal, "top-left causal"}});
}

TEST(finite_difference_check_catches_planted_feature_faults) {
  // Every feature on, so each fault below has something to break: a left window (wider by
  // one changes which keys rows see), a soft cap well into tanh's bend, sinks.
  const AttentionShape s = shape(2, 6, 7, 4, 2, 8, 0.9, true, {2, -1, 1.0});
  const Inputs in = random_inputs(s, 112, true);
  check_faults(s, in, {{Fault::kWideWindow, "window_left one wider"},
                       {Fault::kNoCapSlope, "no 1 - tanh^2 in dS"},
                       {Fault::kSinkOutsideLse, "sink left out of the LSE"},
                       {Fault::kSinkGradientSign, "dsinks' sign flipped"},
                       {Fault::kTopLeftCausal, "top-left window"}});
}

// ---------------------------------------------------------------- against the brute force

TEST(backward_matches_brute_force_on_many_rows_and_keys) {
  // 2 x 6 x 40 query rows and 2 x 3 x 3 key blocks: many chunks for several threads.
  const AttentionShape s = shape(2, 40, 33, 6, 3, 16, 0.25, true);
  const Inputs in = random_inputs(s, 120);
  const Grads got = run_reference(s, in), brute = brute_force(s, in);
  const Agreement a = agreement(got, brute), sp = spread_agreement(got, brute);
  CHECK(a.worst <= kBruteForceTolerance) << a.worst << " at " << a.where;
  CHECK(sp.worst <= kBruteForceTolerance) << sp.worst << " at " << sp.where;
}

TEST(backward_stays_finite_when_exp_of_raw_scores_would_overflow_double) {
  // Scores reach about +-1600 (exp overflows double); P is nearly one-hot. Finite differences
  // are hopeless here; the long double brute force is not.
  for (bool causal : {false, true}) {
    const AttentionShape s = shape(1, 6, 7, 2, 2, 8, 200.0, causal);
    const Inputs in = random_inputs(s, 121);
    const Grads got = run_reference(s, in), brute = brute_force(s, in);
    const Agreement a = agreement(got, brute);
    CHECK(a.worst <= 1e-10) << a.worst << " at " << a.where;  // scores of 1600 amplify rounding
  }
}

// ---------------------------------------------------------------- identities

TEST(backward_identities_hold) {
  // GQA, causal with rows that see no key.
  const AttentionShape s = shape(2, 9, 6, 4, 2, 8, 0.6, true);
  const int64_t B = 2, Sq = 9, Sk = 6, Hq = 4, Hkv = 2, D = 8, group = 2;
  const Inputs in = random_inputs(s, 130);
  const Grads g = run_reference(s, in);
  check_not_trivial(g);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      // Shifting every key by one vector c adds q_i·c to every score of row i and leaves the
      // softmax unchanged, so sum_j dK_j = scale sum_i q_i (sum_j dS_ij) = 0.
      // sum_j dV_j = sum_i (sum_j P_ij) dO_i = the sum of dO over the rows that see a key.
      for (int64_t d = 0; d < D; ++d) {
        double dk_sum = 0, dk_size = 0, dv_sum = 0, do_sum = 0;
        for (int64_t j = 0; j < Sk; ++j) {
          dk_sum += g.dk[((b * Sk + j) * Hkv + hk) * D + d];
          dk_size += std::fabs(g.dk[((b * Sk + j) * Hkv + hk) * D + d]);
          dv_sum += g.dv[((b * Sk + j) * Hkv + hk) * D + d];
        }
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (int64_t i = Sq - Sk; i < Sq; ++i) do_sum += in.dout[((b * Sq + i) * Hq + h) * D + d];
        CHECK(std::fabs(dk_sum) <= 1e-14 * dk_size) << b << " " << hk << " " << d << ": " << dk_sum;
        CHECK(std::fabs(dv_sum - do_sum) <= 1e-14) << b << " " << hk << " " << d << ": " << dv_sum
                                                   << " vs " << do_sum;
      }
      // L depends on Q and K only through scale Q K^T: scaling the group's q by a equals
      // scaling its k by a, so sum q * dq = sum k * dk.
      double q_dq = 0, k_dk = 0;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t i = 0; i < Sq; ++i)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t e = ((b * Sq + i) * Hq + h) * D + d;
            q_dq += double(in.q[e]) * g.dq[e];
          }
      for (int64_t j = 0; j < Sk; ++j)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t e = ((b * Sk + j) * Hkv + hk) * D + d;
          k_dk += double(in.k[e]) * g.dk[e];
        }
      CHECK(std::fabs(q_dq - k_dk) <= 1e-13 * std::max(1.0, std::fabs(q_dq))) << q_dq << " vs " << k_dk;
    }
  // Rows 0..2 see no key: their dq and dq spread are exactly zero.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq - Sk; ++i)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t e = ((b * Sq + i) * Hq + h) * D + d;
          CHECK(g.dq[e] == 0.0 && g.dq_spread[e] == 0.0) << "row " << i << ": " << g.dq[e];
        }
}

TEST(backward_spreads_are_optional_and_change_nothing) {
  const AttentionShape s = shape(1, 7, 9, 4, 2, 8, 0.3, true);
  const Inputs in = random_inputs(s, 140);
  const Grads with = run_reference(s, in, true), without = run_reference(s, in, false);
  CHECK(with.dq == without.dq && with.dk == without.dk && with.dv == without.dv);
  // Only some of them.
  std::vector<double> dq(with.dq.size()), dk(with.dk.size()), dv(with.dv.size()), dv_spread(dv.size());
  warpattn::reference::attention_backward(s, in.q.data(), in.k.data(), in.v.data(), in.dout.data(),
                                          dq.data(), dk.data(), dv.data(), {.dv = dv_spread.data()});
  CHECK(dq == with.dq && dk == with.dk && dv == with.dv && dv_spread == with.dv_spread);
}

TEST(backward_with_no_keys_or_no_queries_writes_zeros) {
  {
    const AttentionShape s = shape(2, 3, 0, 2, 1, 8, 0.3, false);  // no keys: dq = 0
    const Grads g = run_reference(s, random_inputs(s, 150));
    for (double x : g.dq) CHECK(x == 0.0) << x;
    for (double x : g.dq_spread) CHECK(x == 0.0) << x;
  }
  {
    const AttentionShape s = shape(2, 0, 3, 2, 1, 8, 0.3, false);  // no queries: dk = dv = 0
    const Grads g = run_reference(s, random_inputs(s, 151));
    for (const auto* t : {&g.dk, &g.dv, &g.dk_spread, &g.dv_spread})
      for (double x : *t) CHECK(x == 0.0) << x;
  }
}

// ---------------------------------------------------------------- sampled rows

// The sampled functions (the 64K-token GPU test's reference) against attention_backward: the
// same code computes each row, so the values must be the same bits, for rows and keys asked for
// in any order and more than once. The shapes cover what the row-stats pass arranges its loops
// around: partial blocks of 8 query rows, several 64-key chunks of values with a tail that is
// not a multiple of 4 keys, a head dim that is not a multiple of 4, causal rows that see no key
// or a different number of keys within one block, GQA and MQA.
void check_sampled(const AttentionShape& unbound, uint64_t seed, bool with_sinks = false) {
  const Inputs in = random_inputs(unbound, seed, with_sinks);
  const Grads full = run_reference(unbound, in);
  const AttentionShape s = bound(unbound, in);
  check_not_trivial(full);
  const int64_t D = s.head_dim;
  const int64_t query_rows = s.batch * s.heads_q * s.seqlen_q, key_rows = s.batch * s.heads_kv * s.seqlen_k;
  std::mt19937_64 rng(seed);
  auto sample = [&](int64_t n) {  // every row once, shuffled, and a few again
    std::vector<int64_t> rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows[i] = i;
    std::shuffle(rows.begin(), rows.end(), rng);
    for (int i = 0; i < 5; ++i) rows.push_back(int64_t(rng() % uint64_t(n)));
    return rows;
  };
  const std::vector<int64_t> rows = sample(query_rows), keys = sample(key_rows);
  // Where row (b, h, i) and key (b, h_kv, j) sit in the full gradients.
  auto q_offset = [&](int64_t r) {
    const int64_t i = r % s.seqlen_q, h = (r / s.seqlen_q) % s.heads_q, b = r / (s.seqlen_q * s.heads_q);
    return ((b * s.seqlen_q + i) * s.heads_q + h) * D;
  };
  auto kv_offset = [&](int64_t t) {
    const int64_t j = t % s.seqlen_k, h = (t / s.seqlen_k) % s.heads_kv, b = t / (s.seqlen_k * s.heads_kv);
    return ((b * s.seqlen_k + j) * s.heads_kv + h) * D;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> dq(rows.size() * D, nan), dq_spread(dq.size(), nan);
  warpattn::reference::attention_backward_dq_rows(s, in.q.data(), in.k.data(), in.v.data(), in.dout.data(),
                                                  rows.data(), int64_t(rows.size()), dq.data(), dq_spread.data());
  std::vector<double> lse(size_t(query_rows), nan), delta(lse.size(), nan);
  warpattn::reference::attention_backward_row_stats(s, in.q.data(), in.k.data(), in.v.data(), in.dout.data(),
                                                    lse.data(), delta.data());
  std::vector<double> dk(keys.size() * D, nan), dv(dk.size(), nan), dk_spread(dk.size(), nan), dv_spread(dk.size(), nan);
  warpattn::reference::attention_backward_dkv_rows(s, in.q.data(), in.k.data(), in.v.data(), in.dout.data(),
                                                   lse.data(), delta.data(), keys.data(), int64_t(keys.size()),
                                                   dk.data(), dv.data(), dk_spread.data(), dv_spread.data());
  int64_t differ = 0;
  std::string first;
  auto same = [&](const char* name, const std::vector<double>& got, int64_t n, const std::vector<double>& want,
                  int64_t offset) {
    for (int64_t d = 0; d < D; ++d)
      if (!(got[n * D + d] == want[offset + d]) && differ++ == 0)  // NaN (never written) differs too
        first = std::string(name) + " of list entry " + std::to_string(n) + ", element " + std::to_string(d) +
                ": " + std::to_string(got[n * D + d]) + ", want " + std::to_string(want[offset + d]);
  };
  for (size_t n = 0; n < rows.size(); ++n) {
    same("dq", dq, int64_t(n), full.dq, q_offset(rows[n]));
    same("dq spread", dq_spread, int64_t(n), full.dq_spread, q_offset(rows[n]));
  }
  for (size_t n = 0; n < keys.size(); ++n) {
    same("dk", dk, int64_t(n), full.dk, kv_offset(keys[n]));
    same("dv", dv, int64_t(n), full.dv, kv_offset(keys[n]));
    same("dk spread", dk_spread, int64_t(n), full.dk_spread, kv_offset(keys[n]));
    same("dv spread", dv_spread, int64_t(n), full.dv_spread, kv_offset(keys[n]));
  }
  // dsinks from the sampled pass's row stats: the same bits as attention_backward's.
  if (with_sinks) {
    std::vector<double> dsinks(size_t(s.heads_q), nan);
    warpattn::reference::attention_backward_dsinks(s, lse.data(), delta.data(), dsinks.data());
    for (int64_t h = 0; h < s.heads_q; ++h)
      if (!(dsinks[h] == full.dsinks[h]) && differ++ == 0)
        first = "dsinks[" + std::to_string(h) + "]: " + std::to_string(dsinks[h]) + ", want " +
                std::to_string(full.dsinks[h]);
  }
  CHECK(differ == 0) << differ << " values differ from attention_backward's, first " << first;

  // The stats against the forward reference, row by row: LSE from attention_row, D = dO·O.
  // The same arithmetic in the same order (bitwise under the default build); a compiler free to
  // fuse multiply-adds may fuse the two loops differently, hence the tolerance.
  double worst = 0;
  std::vector<double> out(static_cast<size_t>(D));
  for (int64_t r = 0; r < query_rows; ++r) {
    const int64_t i = r % s.seqlen_q, h = (r / s.seqlen_q) % s.heads_q, b = r / (s.seqlen_q * s.heads_q);
    double want_lse;
    warpattn::reference::attention_row(s, in.q.data(), in.k.data(), in.v.data(), b, h, i, out.data(), &want_lse);
    double want_delta = 0;
    for (int64_t d = 0; d < D; ++d) want_delta += double(in.dout[q_offset(r) + d]) * out[d];
    if (std::isinf(want_lse)) {
      CHECK(lse[r] == want_lse && delta[r] == 0.0) << "row " << r << " sees no key: " << lse[r] << ", " << delta[r];
      continue;
    }
    worst = std::max({worst, std::fabs(lse[r] - want_lse) / std::max(1.0, std::fabs(want_lse)),
                      std::fabs(delta[r] - want_delta) / std::max(1.0, std::fabs(want_delta))});
  }
  CHECK(worst <= 1e-13) << "LSE or D off the forward reference's by " << worst;
}

TEST(sampled_backward_matches_the_full_one_bitwise) {
  // Non-causal: 70 rows (8 blocks of 8, one of 6), 150 keys (two full 64-key chunks, a tail of 22).
  check_sampled(shape(1, 70, 150, 2, 2, 16, 0.25, false), 160);
  // Causal, Sq < Sk: every block's rows see different numbers of keys, across chunk boundaries.
  check_sampled(shape(2, 37, 133, 4, 2, 8, 0.3, true), 161);
  // Causal, Sq > Sk: rows 0..12 see no key; MQA.
  check_sampled(shape(1, 45, 32, 3, 1, 8, 0.4, true), 162);
  // A head dim that is not a multiple of 4 (the dot's tail lane), GQA, negative scale.
  check_sampled(shape(2, 19, 70, 4, 2, 6, -0.5, false), 163);
  check_sampled(shape(1, 19, 70, 2, 1, 7, 0.5, true), 164);
}

TEST(sampled_backward_with_the_features_matches_the_full_one_bitwise) {
  // Each row's band of keys starts and ends at a different key within one block of 8 rows and
  // across the 64-key chunks of values; rows with no key but a sink; the soft cap's slope in
  // every dS.
  check_sampled(shape(1, 70, 150, 2, 2, 16, 0.25, false, {40, 30, 1.5}), 165, true);
  check_sampled(shape(2, 37, 133, 4, 2, 8, 0.3, true, {70, -1, 2.0}), 166, true);
  check_sampled(shape(1, 45, 32, 3, 1, 8, 0.4, true, {5, -1, 1.0}), 167, true);  // rows 0..12: only the sink
  check_sampled(shape(2, 19, 70, 4, 2, 6, -0.5, false, {0, 0, 0.8}), 168, true);  // one key per row
  check_sampled(shape(1, 30, 9, 2, 1, 7, 0.5, false, {2, 3}), 169, false);       // window alone, Sq > Sk
}

TEST(sampled_backward_of_empty_sequences) {
  // No keys: dq rows are zero (and LSE -inf). No query rows: dk and dv rows are zero.
  const AttentionShape no_keys = shape(1, 3, 0, 2, 1, 8, 0.3, false);
  const Inputs a = random_inputs(no_keys, 170);
  const std::vector<int64_t> rows = {0, 5, 2};
  std::vector<double> dq(rows.size() * 8, 1.0), spread(dq.size(), 1.0);
  warpattn::reference::attention_backward_dq_rows(no_keys, a.q.data(), a.k.data(), a.v.data(), a.dout.data(),
                                                  rows.data(), 3, dq.data(), spread.data());
  for (size_t e = 0; e < dq.size(); ++e) CHECK(dq[e] == 0.0 && spread[e] == 0.0) << e;
  const AttentionShape no_rows = shape(1, 0, 3, 2, 1, 8, 0.3, false);
  const Inputs b = random_inputs(no_rows, 171);
  const std::vector<int64_t> keys = {2, 0};
  std::vector<double> dk(keys.size() * 8, 1.0), dv(dk.size(), 1.0);
  warpattn::reference::attention_backward_dkv_rows(no_rows, b.q.data(), b.k.data(), b.v.data(), b.dout.data(),
                                                   nullptr, nullptr, keys.data(), 2, dk.data(), dv.data());
  for (size_t e = 0; e < dk.size(); ++e) CHECK(dk[e] == 0.0 && dv[e] == 0.0) << e;
}
