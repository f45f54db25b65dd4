// The CPU reference backward: the gradient formulas evaluated directly in fp64, P recomputed
// from the scores (no LSE or O from a GPU pass), no tiling of the sums, so it shares none of the
// kernel's tricks. Three steps: every query row's LSE and D (row_stats), then per query row its
// dq row (dq_row), then per key its dk and dv rows (dkv_row). Splitting the work this way lets
// every thread own the elements it writes without a reduction: dq is a sum over keys, dk and dv
// are sums over query rows (and the query heads of a group). The sampled functions
// (attention_backward_dq_rows, attention_backward_dkv_rows) run the same three pieces on the rows
// they are given, so they agree with attention_backward bit for bit. The features of issue 19
// change only what the pieces loop over and one factor: the window bounds every loop over keys
// (visible_key_range) and rows (visible_row_range), the soft cap's slope multiplies dS, and a
// sink is felt only through each row's LSE, from which (with D) dsinks is a sum of its own.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "reference/logit.hpp"
#include "reference/reference.hpp"

namespace warpattn::reference {
namespace {

// a·b in double with four partial sums (one dependent chain would run at the adder's latency).
template <class A, class B>
double dot(const A* a, const B* b, int64_t n) {
  double partial[4] = {0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 4 <= n; d += 4)
    for (int lane = 0; lane < 4; ++lane) partial[lane] += double(a[d + lane]) * double(b[d + lane]);
  for (; d < n; ++d) partial[0] += double(a[d]) * double(b[d]);
  return (partial[0] + partial[1]) + (partial[2] + partial[3]);
}

// body(first, last) over [0, count) in chunks from a shared counter, on up to
// hardware_concurrency() threads, the calling thread among them. A counter rather than an even
// split because causal rows and keys differ in cost.
template <class Body>
void parallel_for(int64_t count, int64_t chunk, const Body& body) {
  if (count <= 0) return;
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (;;) {
      const int64_t first = next.fetch_add(chunk);
      if (first >= count) return;
      body(first, std::min(count, first + chunk));
    }
  };
  const int64_t chunks = (count + chunk - 1) / chunk;
  const int64_t thread_count =
      std::min<int64_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(thread_count - 1));
  for (int64_t t = 1; t < thread_count; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
}

// Query rows per row_stats call and keys per chunk of values there: each key and value row, read
// from memory once, serves every row of the block (at 64K keys K and V are far larger than the
// caches, and reading them once per row would make the pass memory bound on many threads).
constexpr int kStatsRows = 8;
constexpr int64_t kStatsKeys = 64;

// LSE_i and D_i = dO_i·O_i of query rows first_row .. first_row + count - 1 (count <=
// kStatsRows) of batch b, query head h, written to lse[0..count) and delta[0..count). Each row's
// arithmetic is attention_row's followed by dot(dO_i, O_i), in the same order (each score summed
// as dot() sums it, four lanes d ≡ lane mod 4 in order of d, then logit(); the maximum, the sink
// among the candidates; exp(score - max) and O accumulated in order of keys; the sink's
// exp(sink - max) added to the sum last; O divided by the sum; LSE = max + log(sum)), and does
// not depend on the other rows of the block: a row gets the same bits alone or in any block. Only
// the loops are arranged for speed: the rows' q side by side (q_t), so that one element of a key
// multiplies every row of the block at once (4 x kStatsRows independent chains instead of one
// dot's four, vectorised across rows), over the union of the rows' key ranges (each row keeps
// only its own keys). A row with no visible key gets its sink (-inf without one) and 0.
void row_stats(const AttentionShape& s, const float* q, const float* k, const float* v, const float* dout,
               int64_t b, int64_t h, int64_t first_row, int count, double* lse, double* delta) {
  const int64_t Sq = s.seqlen_q, Sk = s.seqlen_k, Hq = s.heads_q, Hkv = s.heads_kv, D = s.head_dim;
  const int64_t key_step = Hkv * D;
  const int64_t h_kv = h / (Hq / Hkv);
  const float* k_head = k + (b * Sk * Hkv + h_kv) * D;
  const float* v_head = v + (b * Sk * Hkv + h_kv) * D;
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  const double sink = sink_logit<double>(s, h);
  // Each row's keys [first, end); the block walks their union [base, base + key_count).
  IndexRange keys[kStatsRows];
  int64_t base = Sk, key_end = 0;
  for (int r = 0; r < count; ++r) {
    keys[r] = visible_key_range(s, first_row + r);
    if (keys[r].size() == 0) continue;
    base = std::min(base, keys[r].first);
    key_end = std::max(key_end, keys[r].end);
  }
  if (key_end <= base) base = key_end = 0;  // no row sees a key
  const int64_t key_count = key_end - base;
  // Reused across calls of one thread: a 64K-key block would otherwise allocate on every call.
  thread_local std::vector<double> scores, q_t, out, v_chunk;
  scores.resize(static_cast<size_t>(count * key_count));  // row r's key j at r * key_count + j - base; P later
  q_t.assign(static_cast<size_t>(D * kStatsRows), 0.0);   // q_t[d * kStatsRows + r]
  out.assign(static_cast<size_t>(count * D), 0.0);
  v_chunk.resize(static_cast<size_t>(kStatsKeys * D));
  for (int r = 0; r < count; ++r)
    for (int64_t d = 0; d < D; ++d) q_t[d * kStatsRows + r] = q[((b * Sq + first_row + r) * Hq + h) * D + d];

  // Scores, and each row's maximum over its visible keys and its sink.
  double max_score[kStatsRows], sum[kStatsRows];
  std::fill(max_score, max_score + count, sink);
  std::fill(sum, sum + count, 0.0);
  for (int64_t j = base; j < key_end; ++j) {
    const float* k_row = k_head + j * key_step;
    double partial[4][kStatsRows] = {};  // [lane][row]
    int64_t d = 0;
    for (; d + 4 <= D; d += 4)
      for (int lane = 0; lane < 4; ++lane) {
        const double k_element = k_row[d + lane];
        for (int r = 0; r < kStatsRows; ++r) partial[lane][r] += q_t[(d + lane) * kStatsRows + r] * k_element;
      }
    for (; d < D; ++d)
      for (int r = 0; r < kStatsRows; ++r) partial[0][r] += q_t[d * kStatsRows + r] * double(k_row[d]);
    for (int r = 0; r < count; ++r) {
      if (j < keys[r].first || j >= keys[r].end) continue;
      const double score = logit<double>(s, (partial[0][r] + partial[1][r]) + (partial[2][r] + partial[3][r]));
      scores[r * key_count + j - base] = score;
      max_score[r] = std::max(max_score[r], score);
    }
  }
  // P_ij up to the row's sum: exp(score - max), summed in order of keys, and O += P_ij v_j in
  // order of keys, four keys per pass over the row (((o + p0 v0) + p1 v1) + ...: the same
  // additions in the same order as one key at a time).
  for (int64_t first_key = base; first_key < key_end; first_key += kStatsKeys) {
    const int64_t chunk_keys = std::min(kStatsKeys, key_end - first_key);
    for (int64_t j = 0; j < chunk_keys; ++j)
      std::copy(v_head + (first_key + j) * key_step, v_head + (first_key + j) * key_step + D,
                v_chunk.begin() + j * D);
    for (int r = 0; r < count; ++r) {
      // This row's keys within the chunk: [lo, lo + n).
      const int64_t lo = std::max(first_key, keys[r].first);
      const int64_t n = std::min(first_key + chunk_keys, keys[r].end) - lo;
      if (n <= 0) continue;
      double* p = scores.data() + r * key_count + lo - base;
      const double* v_rows = v_chunk.data() + (lo - first_key) * D;
      for (int64_t j = 0; j < n; ++j) {
        p[j] = std::exp(p[j] - max_score[r]);
        sum[r] += p[j];
      }
      double* o = out.data() + r * D;
      int64_t j = 0;
      for (; j + 4 <= n; j += 4) {
        const double* v0 = v_rows + j * D;
        for (int64_t d = 0; d < D; ++d) {
          double x = o[d];
          x += p[j] * v0[d];
          x += p[j + 1] * v0[D + d];
          x += p[j + 2] * v0[2 * D + d];
          x += p[j + 3] * v0[3 * D + d];
          o[d] = x;
        }
      }
      for (; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) o[d] += p[j] * v_rows[j * D + d];
    }
  }
  for (int r = 0; r < count; ++r) {
    if (keys[r].size() == 0 && !(sink > kMinusInf)) {  // no key, no sink: out is the constant 0
      lse[r] = kMinusInf;
      delta[r] = 0;
      continue;
    }
    sum[r] += std::exp(sink - max_score[r]);  // the sink: in the sum, not in O (0 without one)
    double* o = out.data() + r * D;
    for (int64_t d = 0; d < D; ++d) o[d] /= sum[r];
    lse[r] = max_score[r] + std::log(sum[r]);
    delta[r] = dot(dout + ((b * Sq + first_row + r) * Hq + h) * D, o, D);
  }
}

// dq_i = scale sum_j dS_ij k_j for query row i of batch b, query head h, from the row's LSE and
// D, and its spread (spread may be null). dS_ij = P_ij (dP_ij - D_i) c_ij, c_ij the soft cap's
// slope (the factor is skipped, not multiplied by 1, without a cap: the bits of the uncapped
// reference stay what they were). A row with no visible key gets zeros.
void dq_row(const AttentionShape& s, const float* q, const float* k, const float* v, const float* dout,
            int64_t b, int64_t h, int64_t i, double lse, double delta, double* dq, double* spread) {
  const int64_t Sq = s.seqlen_q, Sk = s.seqlen_k, Hq = s.heads_q, Hkv = s.heads_kv, D = s.head_dim;
  const int64_t key_step = Hkv * D;
  const double scale = s.softmax_scale;
  const IndexRange keys = visible_key_range(s, i);
  if (keys.size() == 0) {  // no key: out is the constant 0 (a sink or not), so nothing depends on q
    std::fill(dq, dq + D, 0.0);
    if (spread) std::fill(spread, spread + D, 0.0);
    return;
  }
  thread_local std::vector<double> acc_sq;
  acc_sq.assign(static_cast<size_t>(D), 0.0);
  std::fill(dq, dq + D, 0.0);  // the sum, scaled at the end
  const int64_t offset = ((b * Sq + i) * Hq + h) * D;
  const float* q_row = q + offset;
  const float* do_row = dout + offset;
  const float* k_head = k + (b * Sk * Hkv + h / (Hq / Hkv)) * D;
  const float* v_head = v + (b * Sk * Hkv + h / (Hq / Hkv)) * D;
  const bool capped = s.softcap > 0;
  for (int64_t j = keys.first; j < keys.end; ++j) {
    const float* k_row = k_head + j * key_step;
    const LogitAndSlope t = logit_and_slope(s, dot(q_row, k_row, D));
    const double p = std::exp(t.value - lse);
    double ds = p * (dot(do_row, v_head + j * key_step, D) - delta);
    if (capped) ds *= t.slope;
    for (int64_t d = 0; d < D; ++d) {
      const double term = ds * double(k_row[d]);
      dq[d] += term;
      acc_sq[d] += term * term;
    }
  }
  for (int64_t d = 0; d < D; ++d) dq[d] = scale * dq[d];
  if (spread)
    for (int64_t d = 0; d < D; ++d) spread[d] = std::fabs(scale) * std::sqrt(acc_sq[d]);
}

// dv_j = sum P_ij dO_i and dk_j = scale sum dS_ij q_i for key j of batch b, key/value head h_kv,
// over the group's query heads and the rows that see key j, from every row's LSE and D (lse and
// delta in lse's layout [B][Hq][Sq]); their spreads where the pointers are not null. dS as in
// dq_row; the sink needs nothing here beyond its share of each row's LSE.
void dkv_row(const AttentionShape& s, const float* q, const float* k, const float* v, const float* dout,
             const double* row_lse, const double* row_delta, int64_t b, int64_t h_kv, int64_t j, double* dk,
             double* dv, double* dk_spread, double* dv_spread) {
  const int64_t Sq = s.seqlen_q, Sk = s.seqlen_k, Hq = s.heads_q, Hkv = s.heads_kv, D = s.head_dim;
  const int64_t group = Hq / Hkv;
  const double scale = s.softmax_scale;
  thread_local std::vector<double> dk_sq, dv_sq;
  dk_sq.assign(static_cast<size_t>(D), 0.0);
  dv_sq.assign(static_cast<size_t>(D), 0.0);
  std::fill(dk, dk + D, 0.0);  // the sums, dk's scaled at the end
  std::fill(dv, dv + D, 0.0);
  const int64_t offset = ((b * Sk + j) * Hkv + h_kv) * D;
  const float* k_row = k + offset;
  const float* v_row = v + offset;
  const IndexRange rows = visible_row_range(s, j);
  const bool capped = s.softcap > 0;
  for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h)
    for (int64_t i = rows.first; i < rows.end; ++i) {
      const int64_t r = (b * Hq + h) * Sq + i;
      const float* q_row = q + ((b * Sq + i) * Hq + h) * D;
      const float* do_row = dout + ((b * Sq + i) * Hq + h) * D;
      const LogitAndSlope t = logit_and_slope(s, dot(q_row, k_row, D));
      const double p = std::exp(t.value - row_lse[r]);
      double ds = p * (dot(do_row, v_row, D) - row_delta[r]);
      if (capped) ds *= t.slope;
      for (int64_t d = 0; d < D; ++d) {
        const double v_term = p * double(do_row[d]);
        const double k_term = ds * double(q_row[d]);
        dv[d] += v_term;
        dv_sq[d] += v_term * v_term;
        dk[d] += k_term;
        dk_sq[d] += k_term * k_term;
      }
    }
  for (int64_t d = 0; d < D; ++d) dk[d] = scale * dk[d];
  if (dk_spread)
    for (int64_t d = 0; d < D; ++d) dk_spread[d] = std::fabs(scale) * std::sqrt(dk_sq[d]);
  if (dv_spread)
    for (int64_t d = 0; d < D; ++d) dv_spread[d] = std::sqrt(dv_sq[d]);
}

bool has_no_elements(const AttentionShape& s) {
  return s.batch <= 0 || s.heads_q <= 0 || s.heads_kv <= 0 || s.head_dim <= 0;
}

}  // namespace

void attention_backward_row_stats(const AttentionShape& s, const float* q, const float* k, const float* v,
                                  const float* dout, double* lse, double* delta) {
  if (has_no_elements(s)) return;
  // Blocks of kStatsRows consecutive rows of one (batch, head), numbered as lse is laid out.
  const int64_t blocks_per_head = (s.seqlen_q + kStatsRows - 1) / kStatsRows;
  parallel_for(s.batch * s.heads_q * blocks_per_head, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t head = t / blocks_per_head;  // b * Hq + h
      const int64_t first_row = (t % blocks_per_head) * kStatsRows;
      const int count = static_cast<int>(std::min<int64_t>(kStatsRows, s.seqlen_q - first_row));
      const int64_t r = head * s.seqlen_q + first_row;
      row_stats(s, q, k, v, dout, head / s.heads_q, head % s.heads_q, first_row, count, lse + r, delta + r);
    }
  });
}

void attention_backward_dsinks(const AttentionShape& s, const double* lse, const double* delta, double* dsinks) {
  if (s.heads_q <= 0) return;
  // dL/dsink_h: the sink's weight exp(sink_h - L_i) moves O_i by -weight O_i, so the loss by
  // -weight D_i. Summed per head by one thread in order of (b, i): the same bits every time.
  for (int64_t h = 0; h < s.heads_q; ++h) {
    const double sink = sink_logit<double>(s, h);
    double sum = 0;
    if (sink > -std::numeric_limits<double>::infinity())  // else no weight: the gradient is 0
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t i = 0; i < s.seqlen_q; ++i) {
          const int64_t r = (b * s.heads_q + h) * s.seqlen_q + i;
          sum += std::exp(sink - lse[r]) * delta[r];  // L_i >= sink > -inf, so the weight is <= 1
        }
    dsinks[h] = -sum;
  }
}

void attention_backward_dq_rows(const AttentionShape& s, const float* q, const float* k, const float* v,
                                const float* dout, const int64_t* rows, int64_t count, double* dq,
                                double* dq_spread) {
  if (has_no_elements(s)) return;
  const int64_t Sq = s.seqlen_q, Hq = s.heads_q, D = s.head_dim;
  parallel_for(count, 1, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const int64_t i = rows[n] % Sq, h = (rows[n] / Sq) % Hq, b = rows[n] / (Sq * Hq);
      double lse, delta;
      row_stats(s, q, k, v, dout, b, h, i, 1, &lse, &delta);
      dq_row(s, q, k, v, dout, b, h, i, lse, delta, dq + n * D, dq_spread ? dq_spread + n * D : nullptr);
    }
  });
}

void attention_backward_dkv_rows(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 const float* dout, const double* lse, const double* delta, const int64_t* keys,
                                 int64_t count, double* dk, double* dv, double* dk_spread, double* dv_spread) {
  if (has_no_elements(s)) return;
  const int64_t Sk = s.seqlen_k, Hkv = s.heads_kv, D = s.head_dim;
  parallel_for(count, 1, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const int64_t j = keys[n] % Sk, h_kv = (keys[n] / Sk) % Hkv, b = keys[n] / (Sk * Hkv);
      dkv_row(s, q, k, v, dout, lse, delta, b, h_kv, j, dk + n * D, dv + n * D,
              dk_spread ? dk_spread + n * D : nullptr, dv_spread ? dv_spread + n * D : nullptr);
    }
  });
}

void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* dout, double* dq, double* dk, double* dv,
                        const BackwardSpreads& spreads, double* dsinks) {
  if (has_no_elements(s)) {  // no elements to write, and no row to give a sink a gradient
    if (dsinks) std::fill(dsinks, dsinks + std::max<int64_t>(0, s.heads_q), 0.0);
    return;
  }
  const int64_t B = s.batch, Sq = s.seqlen_q, Sk = s.seqlen_k, Hq = s.heads_q, Hkv = s.heads_kv;
  const int64_t D = s.head_dim;

  // ---- Step 1: every query row's LSE and D, in lse's layout [B][Hq][Sq].
  std::vector<double> row_lse(static_cast<size_t>(B * Hq * Sq));
  std::vector<double> row_delta(row_lse.size());
  attention_backward_row_stats(s, q, k, v, dout, row_lse.data(), row_delta.data());
  if (dsinks) attention_backward_dsinks(s, row_lse.data(), row_delta.data(), dsinks);

  // ---- Step 2, per query row: dq_i = scale sum_j dS_ij k_j. Rows numbered as lse, so a
  // chunk shares one kv head.
  parallel_for(B * Hq * Sq, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t i = r % Sq, h = (r / Sq) % Hq, b = r / (Sq * Hq);
      const int64_t offset = ((b * Sq + i) * Hq + h) * D;
      dq_row(s, q, k, v, dout, b, h, i, row_lse[r], row_delta[r], dq + offset,
             spreads.dq ? spreads.dq + offset : nullptr);
    }
  });

  // ---- Step 3, per (batch, kv head, block of keys): dv_j = sum P_ij dO_i and
  // dk_j = scale sum dS_ij q_i over the group's query heads and the rows that see key j.
  // (dsinks came with step 1: it needs only every row's LSE and D.)
  constexpr int64_t kKeyBlock = 16;
  const int64_t key_blocks = (Sk + kKeyBlock - 1) / kKeyBlock;
  parallel_for(B * Hkv * key_blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t block = t % key_blocks, h_kv = (t / key_blocks) % Hkv, b = t / (key_blocks * Hkv);
      const int64_t key_end = std::min(Sk, (block + 1) * kKeyBlock);
      for (int64_t j = block * kKeyBlock; j < key_end; ++j) {
        const int64_t offset = ((b * Sk + j) * Hkv + h_kv) * D;
        dkv_row(s, q, k, v, dout, row_lse.data(), row_delta.data(), b, h_kv, j, dk + offset, dv + offset,
                spreads.dk ? spreads.dk + offset : nullptr, spreads.dv ? spreads.dv + offset : nullptr);
      }
    }
  });
}

}  // namespace warpattn::reference
