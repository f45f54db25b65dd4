// The CPU reference backward: the gradient formulas evaluated directly in fp64, P recomputed
// from the scores (no LSE or O from a GPU pass), no tiling, so it shares none of the kernel's
// tricks. Two passes: one over query rows (O, LSE and D of the row, then its dq row), one over
// keys (their dk and dv rows, P and dS recomputed from the stored LSE and D). Splitting the
// work this way lets every thread own the elements it writes without a reduction: dq is a sum
// over keys, dk and dv are sums over query rows (and the query heads of a group).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

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

}  // namespace

void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* dout, double* dq, double* dk, double* dv,
                        const BackwardSpreads& spreads) {
  const int64_t B = s.batch, Sq = s.seqlen_q, Sk = s.seqlen_k, Hq = s.heads_q, Hkv = s.heads_kv;
  const int64_t D = s.head_dim;
  if (B <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0) return;  // no elements to write
  const int64_t group = Hq / Hkv;
  const double scale = s.softmax_scale;
  const int64_t key_step = Hkv * D;  // floats between consecutive keys of one head

  // Per query row, in lse's layout [B][Hq][Sq]: the row's LSE (P_ij = exp(scale s_ij - LSE_i)
  // in the key pass) and D_i.
  std::vector<double> row_lse(static_cast<size_t>(B * Hq * Sq));
  std::vector<double> row_delta(row_lse.size());

  // ---- Pass 1, per query row: O and LSE by the forward reference, D_i = dO_i·O_i, then
  // dq_i = scale sum_j dS_ij k_j. Rows numbered as lse, so a chunk shares one kv head.
  parallel_for(B * Hq * Sq, 16, [&](int64_t first, int64_t last) {
    std::vector<double> out_row(static_cast<size_t>(D)), acc(out_row.size()), acc_sq(out_row.size());
    for (int64_t r = first; r < last; ++r) {
      const int64_t i = r % Sq, h = (r / Sq) % Hq, b = r / (Sq * Hq);
      const int64_t offset = ((b * Sq + i) * Hq + h) * D;
      double* dq_row = dq + offset;
      double* dq_spread = spreads.dq ? spreads.dq + offset : nullptr;
      const int64_t n = visible_keys(s, i);
      if (n == 0) {
        // No key, no softmax: out is the constant 0, so nothing depends on q here.
        std::fill(dq_row, dq_row + D, 0.0);
        if (dq_spread) std::fill(dq_spread, dq_spread + D, 0.0);
        row_lse[r] = -std::numeric_limits<double>::infinity();
        row_delta[r] = 0;
        continue;
      }
      attention_row(s, q, k, v, b, h, i, out_row.data(), &row_lse[r]);
      const float* q_row = q + offset;
      const float* do_row = dout + offset;
      const double lse = row_lse[r];
      const double delta = dot(do_row, out_row.data(), D);
      row_delta[r] = delta;
      const float* k_head = k + (b * Sk * Hkv + h / group) * D;
      const float* v_head = v + (b * Sk * Hkv + h / group) * D;
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(acc_sq.begin(), acc_sq.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const float* k_row = k_head + j * key_step;
        const double p = std::exp(scale * dot(q_row, k_row, D) - lse);
        const double ds = p * (dot(do_row, v_head + j * key_step, D) - delta);
        for (int64_t d = 0; d < D; ++d) {
          const double term = ds * double(k_row[d]);
          acc[d] += term;
          acc_sq[d] += term * term;
        }
      }
      for (int64_t d = 0; d < D; ++d) dq_row[d] = scale * acc[d];
      if (dq_spread)
        for (int64_t d = 0; d < D; ++d) dq_spread[d] = std::fabs(scale) * std::sqrt(acc_sq[d]);
    }
  });

  // ---- Pass 2, per (batch, kv head, block of keys): dv_j = sum P_ij dO_i and
  // dk_j = scale sum dS_ij q_i over the group's query heads and the rows that see key j.
  constexpr int64_t kKeyBlock = 16;
  const int64_t key_blocks = (Sk + kKeyBlock - 1) / kKeyBlock;
  parallel_for(B * Hkv * key_blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<double> dk_acc(static_cast<size_t>(D)), dv_acc(dk_acc.size());
    std::vector<double> dk_sq(dk_acc.size()), dv_sq(dk_acc.size());
    for (int64_t t = first; t < last; ++t) {
      const int64_t block = t % key_blocks, h_kv = (t / key_blocks) % Hkv, b = t / (key_blocks * Hkv);
      const int64_t key_end = std::min(Sk, (block + 1) * kKeyBlock);
      for (int64_t j = block * kKeyBlock; j < key_end; ++j) {
        const int64_t offset = ((b * Sk + j) * Hkv + h_kv) * D;
        const float* k_row = k + offset;
        const float* v_row = v + offset;
        std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
        std::fill(dk_sq.begin(), dk_sq.end(), 0.0);
        std::fill(dv_sq.begin(), dv_sq.end(), 0.0);
        // Bottom-right causal: row i sees key j iff i >= j + Sq - Sk.
        const int64_t first_row = s.causal ? std::max<int64_t>(0, j + Sq - Sk) : 0;
        for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h)
          for (int64_t i = first_row; i < Sq; ++i) {
            const int64_t r = (b * Hq + h) * Sq + i;
            const float* q_row = q + ((b * Sq + i) * Hq + h) * D;
            const float* do_row = dout + ((b * Sq + i) * Hq + h) * D;
            const double p = std::exp(scale * dot(q_row, k_row, D) - row_lse[r]);
            const double ds = p * (dot(do_row, v_row, D) - row_delta[r]);
            for (int64_t d = 0; d < D; ++d) {
              const double v_term = p * double(do_row[d]);
              const double k_term = ds * double(q_row[d]);
              dv_acc[d] += v_term;
              dv_sq[d] += v_term * v_term;
              dk_acc[d] += k_term;
              dk_sq[d] += k_term * k_term;
            }
          }
        for (int64_t d = 0; d < D; ++d) {
          dk[offset + d] = scale * dk_acc[d];
          dv[offset + d] = dv_acc[d];
        }
        if (spreads.dk)
          for (int64_t d = 0; d < D; ++d) spreads.dk[offset + d] = std::fabs(scale) * std::sqrt(dk_sq[d]);
        if (spreads.dv)
          for (int64_t d = 0; d < D; ++d) spreads.dv[offset + d] = std::sqrt(dv_sq[d]);
      }
    }
  });
}

}  // namespace warpattn::reference
