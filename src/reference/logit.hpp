// The logit t_ij of a raw dot product x_ij = q_i·k_j (scale, then the soft cap), shared by the
// forward and the backward reference. One expression in one place: the backward's P_ij =
// exp(t_ij - L_i) is only a probability if its t_ij has the bits the L_i was summed from, and
// the sampled backward promises the full one's bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "reference/reference.hpp"

namespace warpattn::reference {

// t = scale x, or softcap tanh(scale x / softcap) when softcap > 0; in Acc (double, or float
// for attention_row_fp32, whose scale and cap are then rounded to float first).
template <class Acc>
Acc logit(const AttentionShape& s, Acc dot) {
  const Acc scaled = static_cast<Acc>(s.softmax_scale) * dot;
  if (!(s.softcap > 0)) return scaled;
  const Acc cap = static_cast<Acc>(s.softcap);
  return cap * std::tanh(scaled / cap);
}

// The logit and c = dt / d(scale x), the factor the soft cap puts into dS: 1 - tanh^2 of the
// same argument (1 without a cap). `value` is logit<double>'s bits.
struct LogitAndSlope {
  double value;
  double slope;
};
inline LogitAndSlope logit_and_slope(const AttentionShape& s, double dot) {
  const double scaled = s.softmax_scale * dot;
  if (!(s.softcap > 0)) return {scaled, 1.0};
  const double t = std::tanh(scaled / s.softcap);
  return {s.softcap * t, 1.0 - t * t};
}

// The sink of query head h, -inf (no weight) without sinks.
template <class Acc>
Acc sink_logit(const AttentionShape& s, int64_t h) {
  return s.sinks ? static_cast<Acc>(s.sinks[h]) : -std::numeric_limits<Acc>::infinity();
}

}  // namespace warpattn::reference
