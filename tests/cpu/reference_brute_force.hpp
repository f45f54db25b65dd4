// Shared by the CPU tests of the fp64 forward reference (test_reference.cpp for the plain model,
// test_reference_features.cpp for issue 19's window, soft cap and sinks): feature-aware shapes
// and inputs, attention brute-forced from its definition, and the comparison of the reference
// against it. test_reference_backward.cpp shares only Features and shape(); its inputs differ
// (grid values for exact finite differences, and dout).
//
// One brute force serves both forward test files: without features it reduces to plain
// softmax(scale * Q K^T + causal mask) V, term for term in the same order, so the plain tests
// compare against the same long double numbers as before. It deliberately shares nothing with
// the reference: GQA expanded into full copies, every logit in long double, the mask written
// out from FlashAttention's definition, the soft cap evaluated as its formula, exp without a
// maximum subtracted (long double's range covers these logits), the sink added to the explicit
// row sum, masked entries zeroed.
//
// Header-only with inline functions in a named namespace (the test files keep their own helpers
// in anonymous namespaces and pull these in with using-declarations), so the test_cpu binary
// links one copy of each.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "harness.hpp"
#include "reference/reference.hpp"

namespace reference_test {

using warpattn::reference::AttentionShape;
using Real = long double;

// The model features of issue 19 a shape may add (sinks come with the inputs).
struct Features {
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;
};

inline AttentionShape shape(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d,
                            double scale, bool causal, Features f = {}) {
  AttentionShape s{batch, sq, sk, hq, hkv, d, scale, causal};
  s.window_left = f.window_left;
  s.window_right = f.window_right;
  s.softcap = f.softcap;
  return s;
}

inline std::vector<float> random_values(int64_t n, uint64_t seed, float low = -1.f, float high = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& x : values) x = dist(rng);
  return values;
}

struct Inputs {
  std::vector<float> q, k, v;
  std::vector<float> sinks;  // [Hq], empty for none
};

inline Inputs random_inputs(const AttentionShape& s, uint64_t seed, bool with_sinks = false) {
  Inputs in{random_values(s.batch * s.seqlen_q * s.heads_q * s.head_dim, seed),
            random_values(s.batch * s.seqlen_k * s.heads_kv * s.head_dim, seed + 1),
            random_values(s.batch * s.seqlen_k * s.heads_kv * s.head_dim, seed + 2),
            {}};
  // Sinks of the size of the logits here (|t| <~ 2): large enough to take a real share.
  if (with_sinks) in.sinks = random_values(s.heads_q, seed + 3, -2.f, 2.f);
  return in;
}

// The shape the reference is given: s with its sinks pointing into `in` (none if it has none).
inline AttentionShape bound(AttentionShape s, const Inputs& in) {
  s.sinks = in.sinks.empty() ? nullptr : in.sinks.data();
  return s;
}

// The mask matrix [Sq][Sk] from the definition: row i sees key j iff, with offset = Sk - Sq,
// j >= i + offset - left (left >= 0) and j <= i + offset + right (right >= 0), where causal
// means right = 0 whatever window_right says.
inline std::vector<char> mask_by_definition(const AttentionShape& s) {
  std::vector<char> mask(static_cast<size_t>(s.seqlen_q * s.seqlen_k));
  const int64_t offset = s.seqlen_k - s.seqlen_q;
  const int64_t right = s.causal ? 0 : s.window_right;
  for (int64_t i = 0; i < s.seqlen_q; ++i)
    for (int64_t j = 0; j < s.seqlen_k; ++j)
      mask[i * s.seqlen_k + j] = (s.window_left < 0 || j >= i + offset - s.window_left) &&
                                 (right < 0 || j <= i + offset + right);
  return mask;
}

struct Result {
  std::vector<Real> out;  // [B][Sq][Hq][D]
  std::vector<Real> lse;  // [B][Hq][Sq]
};

// The logit from its formula, in long double.
inline Real logit_by_definition(const AttentionShape& s, Real dot) {
  const Real scaled = Real(s.softmax_scale) * dot;
  return s.softcap > 0 ? Real(s.softcap) * std::tanh(scaled / Real(s.softcap)) : scaled;
}

// softmax over the visible logits and the sink, times V, from the definition.
inline Result brute_force(const AttentionShape& s, const Inputs& in) {
  const int64_t B = s.batch, Sq = s.seqlen_q, Sk = s.seqlen_k, Hq = s.heads_q, D = s.head_dim;
  // GQA by definition: query head h reads key/value head h / (Hq / Hkv). Make full copies.
  const int64_t group = Hq / s.heads_kv;
  std::vector<Real> k(static_cast<size_t>(B * Sk * Hq * D)), v(k.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Sk; ++j)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t from = ((b * Sk + j) * s.heads_kv + h / group) * D + d;
          k[((b * Sk + j) * Hq + h) * D + d] = in.k[from];
          v[((b * Sk + j) * Hq + h) * D + d] = in.v[from];
        }
  const std::vector<char> mask = mask_by_definition(s);
  Result r{std::vector<Real>(static_cast<size_t>(B * Sq * Hq * D)), std::vector<Real>(static_cast<size_t>(B * Hq * Sq))};
  std::vector<Real> weights(static_cast<size_t>(Sk));  // exp(logits), masked to 0
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        Real sum = in.sinks.empty() ? Real(0) : std::exp(Real(in.sinks[h]));
        for (int64_t j = 0; j < Sk; ++j) {
          Real dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += Real(in.q[((b * Sq + i) * Hq + h) * D + d]) * k[((b * Sk + j) * Hq + h) * D + d];
          weights[j] = mask[i * Sk + j] ? std::exp(logit_by_definition(s, dot)) : Real(0);
          sum += weights[j];
        }
        r.lse[(b * Hq + h) * Sq + i] = sum > 0 ? std::log(sum) : -std::numeric_limits<Real>::infinity();
        for (int64_t d = 0; d < D; ++d) {
          Real acc = 0;
          for (int64_t j = 0; j < Sk; ++j) acc += weights[j] * v[((b * Sk + j) * Hq + h) * D + d];
          r.out[((b * Sq + i) * Hq + h) * D + d] = sum > 0 ? acc / sum : Real(0);
        }
      }
  return r;
}

struct Reference {
  std::vector<double> out, lse;
};

inline Reference run_reference(const AttentionShape& s, const Inputs& in) {
  Reference r{std::vector<double>(static_cast<size_t>(s.batch * s.seqlen_q * s.heads_q * s.head_dim)),
              std::vector<double>(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q))};
  warpattn::reference::attention(bound(s, in), in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data());
  return r;
}

// |a - b| within `tolerance` relative to max(1, |b|); equal infinities match.
inline bool close(double a, Real b, double tolerance) {
  if (std::isinf(b)) return Real(a) == b;
  return std::fabs(Real(a) - b) <= Real(tolerance) * std::max(Real(1), std::fabs(b));
}

// The fp64 reference against the brute force on every output and lse value (the first five
// mismatches reported). Returns how many rows see no key, so that a test can insist that its
// shape has some.
inline int64_t check_against_brute_force(const AttentionShape& s, uint64_t seed, bool with_sinks = false) {
  const Inputs in = random_inputs(s, seed, with_sinks);
  const Result want = brute_force(s, in);
  const Reference got = run_reference(s, in);
  constexpr double kTolerance = 1e-12;  // fp64 against long double, for these tiny sums
  int reported = 0;
  for (size_t i = 0; i < want.out.size() && reported < 5; ++i) {
    const bool ok = close(got.out[i], want.out[i], kTolerance);
    CHECK(ok) << "out[" << i << "] = " << got.out[i] << ", brute force " << double(want.out[i]);
    reported += !ok;
  }
  for (size_t i = 0; i < want.lse.size() && reported < 5; ++i) {
    const bool ok = close(got.lse[i], want.lse[i], kTolerance);
    CHECK(ok) << "lse[" << i << "] = " << got.lse[i] << ", brute force " << double(want.lse[i]);
    reported += !ok;
  }
  const std::vector<char> mask = mask_by_definition(s);
  int64_t empty_rows = 0;
  for (int64_t i = 0; i < s.seqlen_q; ++i)
    empty_rows += std::none_of(mask.begin() + i * s.seqlen_k, mask.begin() + (i + 1) * s.seqlen_k, [](char m) { return m; });
  return empty_rows;
}

}  // namespace reference_test
