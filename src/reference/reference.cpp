// The CPU attention reference: a plain two-pass softmax per query row, with no tiling and no
// online rescaling, so that it shares none of the kernel's tricks (and none of its bugs).
#include "reference/reference.hpp"

#include "reference/logit.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace warpattn::reference {
namespace {

// q·k in Acc. Four independent partial sums instead of one running sum: a single chain of
// dependent additions runs at the adder's latency, and this loop is most of the reference's
// time; the rounding differs only in summation order.
template <class Acc>
Acc dot(const float* a, const float* b, int64_t n) {
  Acc partial[4] = {0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 4 <= n; d += 4)
    for (int lane = 0; lane < 4; ++lane) partial[lane] += Acc(a[d + lane]) * Acc(b[d + lane]);
  for (; d < n; ++d) partial[0] += Acc(a[d]) * Acc(b[d]);
  return (partial[0] + partial[1]) + (partial[2] + partial[3]);
}

// The fp64 and fp32 references must be the same algorithm, differing only in the type every
// sum and product is carried in; a template over that type guarantees it.
template <class Acc>
void softmax_row(const AttentionShape& s, const float* q, const float* k, const float* v, int64_t b,
                 int64_t h, int64_t row, Acc* out_row, Acc* lse, Acc* spread = nullptr) {
  const int64_t d_count = s.head_dim;
  const IndexRange keys = visible_key_range(s, row);
  const Acc sink = sink_logit<Acc>(s, h);
  std::fill(out_row, out_row + d_count, Acc(0));
  if (spread) std::fill(spread, spread + d_count, Acc(0));
  // No key and no sink: nothing to normalise. (A sink alone is a softmax over one logit with
  // no value: O = 0 and L = sink, which the general path below gives.)
  if (keys.size() == 0 && !(sink > -std::numeric_limits<Acc>::infinity())) {
    if (lse) *lse = -std::numeric_limits<Acc>::infinity();
    return;
  }
  const int64_t h_kv = h / (s.heads_q / s.heads_kv);
  const float* q_row = q + ((b * s.seqlen_q + row) * s.heads_q + h) * d_count;
  // Consecutive keys of one head are heads_kv * head_dim floats apart.
  const int64_t key_step = s.heads_kv * d_count;
  const float* k_head = k + (b * s.seqlen_k * s.heads_kv + h_kv) * d_count + keys.first * key_step;
  const float* v_head = v + (b * s.seqlen_k * s.heads_kv + h_kv) * d_count + keys.first * key_step;
  const int64_t n = keys.size();

  // Reused across rows of one thread: a 64K-key row would otherwise allocate on every call.
  thread_local std::vector<Acc> scores;
  scores.resize(static_cast<size_t>(n));
  // The sink takes part in the maximum like any logit (it may be the largest).
  Acc max_score = sink;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = logit<Acc>(s, dot<Acc>(q_row, k_head + j * key_step, d_count));
    max_score = std::max(max_score, scores[j]);
  }

  // Subtracting the row maximum keeps every exponential in (0, 1], so nothing overflows
  // however large the scaled scores are.
  Acc denominator = 0;
  for (int64_t j = 0; j < n; ++j) {
    const Acc p = std::exp(scores[j] - max_score);
    denominator += p;
    const float* v_row = v_head + j * key_step;
    for (int64_t d = 0; d < d_count; ++d) out_row[d] += p * Acc(v_row[d]);
    if (spread)
      for (int64_t d = 0; d < d_count; ++d) spread[d] += (p * Acc(v_row[d])) * (p * Acc(v_row[d]));
  }
  // The sink joins the denominator only, after the keys (exp(-inf) = 0 without one).
  denominator += std::exp(sink - max_score);
  for (int64_t d = 0; d < d_count; ++d) out_row[d] /= denominator;
  if (spread)
    for (int64_t d = 0; d < d_count; ++d) spread[d] = std::sqrt(spread[d]) / denominator;
  if (lse) *lse = max_score + std::log(denominator);
}

}  // namespace

WindowBounds effective_window(const AttentionShape& s) {
  // Any negative bound is unbounded; causal is a right bound of 0 whatever window_right says.
  WindowBounds w;
  w.left = s.window_left < 0 ? -1 : s.window_left;
  w.right = s.causal ? 0 : (s.window_right < 0 ? -1 : s.window_right);
  return w;
}

IndexRange visible_key_range(const AttentionShape& s, int64_t row) {
  // Key j is visible iff diagonal - left <= j <= diagonal + right, diagonal = row + Sk - Sq.
  const WindowBounds w = effective_window(s);
  const int64_t diagonal = row + s.seqlen_k - s.seqlen_q;
  IndexRange r{0, s.seqlen_k};
  if (w.left >= 0) r.first = std::clamp<int64_t>(diagonal - w.left, 0, s.seqlen_k);
  if (w.right >= 0) r.end = std::clamp<int64_t>(diagonal + w.right + 1, 0, s.seqlen_k);
  r.end = std::max(r.end, r.first);  // a window wholly outside the keys
  return r;
}

IndexRange visible_row_range(const AttentionShape& s, int64_t key) {
  // The same inequalities solved for the row: key - offset - right <= row <= key - offset + left.
  const WindowBounds w = effective_window(s);
  const int64_t diagonal_row = key - (s.seqlen_k - s.seqlen_q);
  IndexRange r{0, s.seqlen_q};
  if (w.right >= 0) r.first = std::clamp<int64_t>(diagonal_row - w.right, 0, s.seqlen_q);
  if (w.left >= 0) r.end = std::clamp<int64_t>(diagonal_row + w.left + 1, 0, s.seqlen_q);
  r.end = std::max(r.end, r.first);
  return r;
}

int64_t visible_keys(const AttentionShape& s, int64_t row) { return visible_key_range(s, row).size(); }

double visible_pairs(const AttentionShape& s) {
  const WindowBounds w = effective_window(s);
  if (w.left < 0 && w.right < 0) return double(s.seqlen_q) * double(s.seqlen_k);
  double pairs = 0;
  for (int64_t row = 0; row < s.seqlen_q; ++row) pairs += double(visible_keys(s, row));
  return pairs;
}

void attention_row(const AttentionShape& s, const float* q, const float* k, const float* v,
                   int64_t b, int64_t h, int64_t row, double* out_row, double* lse) {
  softmax_row<double>(s, q, k, v, b, h, row, out_row, lse);
}

void attention_row_with_spread(const AttentionShape& s, const float* q, const float* k, const float* v, int64_t b,
                               int64_t h, int64_t row, double* out_row, double* lse, double* spread) {
  softmax_row<double>(s, q, k, v, b, h, row, out_row, lse, spread);
}

void attention_row_fp32(const AttentionShape& s, const float* q, const float* k, const float* v,
                        int64_t b, int64_t h, int64_t row, float* out_row, float* lse) {
  softmax_row<float>(s, q, k, v, b, h, row, out_row, lse);
}

void attention(const AttentionShape& s, const float* q, const float* k, const float* v, double* out,
               double* lse) {
  // Rows are numbered as lse is laid out, [B][Hq][Sq], so the rows a thread takes together
  // share one key/value head (cache friendly) and row r's lse is simply lse[r].
  const int64_t rows = s.batch * s.heads_q * s.seqlen_q;
  if (rows <= 0) return;
  // Rows are handed out in small chunks from a shared counter rather than split evenly up
  // front, because masked rows differ in cost (a causal row i sees about i keys).
  constexpr int64_t kChunk = 16;
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (;;) {
      const int64_t first = next.fetch_add(kChunk);
      if (first >= rows) return;
      const int64_t last = std::min(rows, first + kChunk);
      for (int64_t r = first; r < last; ++r) {
        const int64_t row = r % s.seqlen_q;
        const int64_t h = (r / s.seqlen_q) % s.heads_q;
        const int64_t b = r / (s.seqlen_q * s.heads_q);
        double* out_row = out + ((b * s.seqlen_q + row) * s.heads_q + h) * s.head_dim;
        attention_row(s, q, k, v, b, h, row, out_row, lse ? lse + r : nullptr);
      }
    }
  };
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
  const int64_t thread_count =
      std::min<int64_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(thread_count - 1));
  for (int64_t t = 1; t < thread_count; ++t) threads.emplace_back(worker);
  worker();  // the calling thread works too
  for (std::thread& t : threads) t.join();
}

ErrorStats compare(const float* got, const double* want, int64_t n) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  ErrorStats stats;
  double diff_squared = 0, want_squared = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[i];
    const double w = want[i];
    if (std::isnan(g)) {
      if (stats.nan_count++ == 0) stats.worst_index = i;
      continue;
    }
    double error;
    if (!std::isfinite(w)) {
      // Only an identical value matches an infinite (or NaN) expectation.
      error = g == w ? 0.0 : kInf;
    } else {
      error = std::fabs(g - w);
      want_squared += w * w;
    }
    diff_squared += error * error;
    if (stats.nan_count == 0 && (error > stats.max_abs || stats.worst_index < 0)) {
      stats.max_abs = error;
      stats.worst_index = i;
    }
  }
  if (stats.nan_count > 0) {
    stats.rel_l2 = kInf;
    stats.max_abs = kInf;
  } else if (want_squared > 0) {
    stats.rel_l2 = std::sqrt(diff_squared / want_squared);
  } else {
    stats.rel_l2 = diff_squared == 0 ? 0.0 : kInf;
  }
  return stats;
}

}  // namespace warpattn::reference
