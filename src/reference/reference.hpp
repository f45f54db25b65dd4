// The CPU reference for exact attention: what every GPU result is judged against.
//
// Straightforward two-pass softmax per query row (scores, then max-subtracted exponentials),
// in fp64 by default; an fp32 variant of the same algorithm shows how much of a GPU error is
// simply fp32 accumulation. Inputs are the values the GPU sees (already rounded to fp16/bf16
// and widened to float), in contiguous row-major arrays:
//   q: [B][Sq][Hq][D]    k, v: [B][Sk][Hkv][D]    out: [B][Sq][Hq][D]    lse: [B][Hq][Sq]
#pragma once

#include <cstdint>

namespace warpattn::reference {

// The problem: sizes, the score's scale, the mask, and the model features of issue 19 (sliding
// window, soft cap, attention sinks), in FlashAttention's conventions. Every entry point below
// takes the features from here, so one AttentionShape describes a forward and its backward.
// Defaults leave each feature off.
//
// For query row i of (batch b, query head h) and key j of its key/value head, with the raw dot
// product x_ij = q_i·k_j:
//   logit   t_ij = scale x_ij                              (softcap == 0)
//           t_ij = softcap tanh(scale x_ij / softcap)      (softcap > 0)
//   mask    i sees j iff 0 <= j < Sk and, with offset = Sk - Sq (bottom-right aligned) and
//           (left, right) = effective_window(s):
//             (left < 0 || j >= i + offset - left) && (right < 0 || j <= i + offset + right)
//   sink    sink_h = sinks[h] (natural-log units, neither scaled nor soft-capped), or none
//   LSE     L_i = log(sum_{j seen} exp(t_ij) + exp(sink_h))   (the last term only with sinks)
//   P       P_ij = exp(t_ij - L_i) for j seen, else 0
//   out     O_i = sum_j P_ij v_j
// The sink is one more logit in the softmax's denominator with no value vector: it takes the
// weight exp(sink_h - L_i) = 1 - sum_j P_ij away from the keys. A row that sees no key gets
// O_i = 0 and L_i = sink_h (-inf without sinks, or with a sink of -inf). So a very negative
// finite sink (-1e30) gives the bits of no sink everywhere except in such a row's L_i.
struct AttentionShape {
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;
  double softmax_scale = 1.0;
  // Bottom-right aligned: query `row` sees key j iff j <= row + seqlen_k - seqlen_q; the same
  // as window_right = 0, and it wins over any window_right given with it (FlashAttention sets
  // window_right to 0 when causal). It combines with window_left.
  bool causal = false;
  // Sliding window (issue 19), in keys either side of the row's diagonal j = row + seqlen_k -
  // seqlen_q; a negative value (-1 by convention) leaves that side unbounded. (0, 0) keeps only
  // the diagonal. Both are used as given, with no clamping to the sequence lengths.
  // FlashAttention's host code turns a bound >= seqlen_k into -1: the same mask for
  // window_left, and for window_right too unless seqlen_k <= window_right < seqlen_q - 1 (only
  // possible with seqlen_q > seqlen_k + 1), where the formula leaves the first rows fewer keys.
  // A GPU API that clamps so must clamp the AttentionShape it checks against the same way.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Soft cap of the logits (Gemma 2 and others): > 0 is the cap, 0 (or anything not > 0) is off.
  double softcap = 0;
  // One logit per query head, [Hq] floats, or null for no sinks (gpt-oss and others). Finite or
  // -inf (-inf is the same as no sink); the pointer must outlive the calls that use it.
  const float* sinks = nullptr;
};

// The mask's bounds with causal folded in: {window_left, causal ? 0 : window_right}, each
// negative value meaning unbounded (returned as -1). Everything in the reference masks through
// this, so causal and the window can never disagree.
struct WindowBounds {
  int64_t left = -1;
  int64_t right = -1;
};
WindowBounds effective_window(const AttentionShape& s);

// A half-open range [first, end) of key or query positions, empty when first == end.
struct IndexRange {
  int64_t first = 0;
  int64_t end = 0;
  int64_t size() const { return end - first; }
};

// The keys query `row` sees: one contiguous range, clamped to [0, seqlen_k) (empty when the
// window lies wholly before the first key or after the last).
IndexRange visible_key_range(const AttentionShape& s, int64_t row);

// The query rows that see key `key`, clamped to [0, seqlen_q): the transpose of
// visible_key_range (row i is in visible_row_range(s, j) iff j is in visible_key_range(s, i)).
IndexRange visible_row_range(const AttentionShape& s, int64_t key);

// How many keys query `row` sees: visible_key_range(s, row).size(). All of them without a mask;
// 0 when the row's window lies outside the keys (with causal, when the row's diagonal lies
// before the first key, which happens when seqlen_q > seqlen_k).
int64_t visible_keys(const AttentionShape& s, int64_t row);

// The (query, key) pairs the mask (causal and window) leaves for one (batch, head): the sum of
// visible_keys over the query rows (seqlen_q x seqlen_k without a mask). Attention's FLOPs are
// 4 x head_dim per pair. Sinks add no pair.
double visible_pairs(const AttentionShape& s);

// One output row: batch b, query head h, query position `row`. Query head h reads key/value
// head h / (Hq / Hkv). Writes head_dim values O_i to out_row and L_i (the natural-log
// log-sum-exp of the logits t_ij, the sink's included) to *lse (lse may be null). A row with no
// visible key gets zeros and its sink (-inf without one).
void attention_row(const AttentionShape& s, const float* q, const float* k, const float* v,
                   int64_t b, int64_t h, int64_t row, double* out_row, double* lse);

// attention_row, and for every output element d its spread sqrt(sum_j (P_j v_jd)^2), P_j the
// normalised softmax weights: rounding each P_j (or each v_jd) independently by a relative
// error of standard deviation e moves element d by about e times its spread (standard
// deviation). The error models of the GPU tests are built on it.
void attention_row_with_spread(const AttentionShape& s, const float* q, const float* k, const float* v, int64_t b,
                               int64_t h, int64_t row, double* out_row, double* lse, double* spread);

// The same algorithm with every sum, exponential and product in float32 (the logits, the soft
// cap's tanh and the sink's exponential too; softmax_scale and softcap are rounded to float).
void attention_row_fp32(const AttentionShape& s, const float* q, const float* k, const float* v,
                        int64_t b, int64_t h, int64_t row, float* out_row, float* lse);

// Every row, spread over std::thread::hardware_concurrency() threads. lse may be null.
void attention(const AttentionShape& s, const float* q, const float* k, const float* v, double* out,
               double* lse);

// ---- Backward (issue 14)
//
// Optional outputs of attention_backward: one spread per gradient element, laid out as that
// gradient (dq: [B][Sq][Hq][D], dk and dv: [B][Sk][Hkv][D]); a null pointer skips it. Each is
// the root sum of squares of the terms the element is a sum of, so a GPU that rounds every
// term's operand by a relative error of standard deviation e is off by about e times the
// spread:
//   dv_jd: sqrt(sum_{h,i} (P_ij dO_id)^2)           P rounded to 16 bits for dV = P^T dO
//   dq_id: sqrt(sum_j (scale dS_ij K_jd)^2)         dS rounded to 16 bits for dQ = dS K
//   dk_jd: sqrt(sum_{h,i} (scale dS_ij Q_id)^2)     ... and for dK = dS^T Q
// (h over the query heads of the key/value head's group, i over the rows that see key j; dS as
// attention_backward defines it, the soft cap's factor included).
// What they do not cover: an error in D_i (a GPU takes it from its own rounded O) moves every
// dS_ij of the row by P_ij times that error, a correlated term the error model adds itself.
struct BackwardSpreads {
  double* dq = nullptr;
  double* dk = nullptr;
  double* dv = nullptr;
};

// Gradients of L = sum(out * dout), out = attention(s, q, k, v), in fp64, from the definitions
// with nothing taken from a forward pass (so a GPU's LSE or O error cannot hide in both sides).
// With P, L_i and the logits t_ij as AttentionShape defines them (mask, soft cap, sink):
//   O = P V   D_i = sum_d dO_id O_id   dP = dO V^T
//   dS_ij = P_ij (dP_ij - D_i) c_ij, the gradient with respect to the scaled score scale x_ij,
//           c_ij = dt_ij / d(scale x_ij) = 1 - tanh^2(scale x_ij / softcap) (1 without a cap)
//   dQ = scale dS K   dK = scale dS^T Q   dV = P^T dO
//   dsink_h = -sum_{b,i} exp(sink_h - L_i) D_i   (over the batch and the rows of query head h)
// The sink takes no part in dV (it has no value) and enters dS only through L_i, so dS has the
// same form with and without it. q, k, v as for attention(); dout [B][Sq][Hq][D] like out; dq
// [B][Sq][Hq][D], dk and dv [B][Sk][Hkv][D], every element written; dsinks [Hq], written
// unless null (zeros without s.sinks). Under GQA dk and dv are summed over the query heads of
// the group; a row with no visible key contributes nothing (its O is 0, so D_i = 0 and it adds
// nothing to dsinks either) and gets a zero dq row.
// Spread over std::thread::hardware_concurrency() threads: first per block of query rows
// (their O, LSE and D), then per query row (its dq row), then per (batch, kv head, block of keys)
// (their dk and dv rows), so no two threads write one element, and each element is summed by one
// thread in a fixed order: the result is bitwise the same for any thread count.
void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* dout, double* dq, double* dk, double* dv,
                        const BackwardSpreads& spreads = {}, double* dsinks = nullptr);

// ---- Sampled backward: attention_backward for chosen rows only, where the whole would take too
// long (at 64K tokens it is ~5e11 multiply-adds per head, three times over). Same inputs as
// attention_backward; the same code computes each row, so every value is bitwise the one
// attention_backward gives. Rows are numbered as lse is laid out: query row i of batch b, query
// head h is (b * Hq + h) * Sq + i; key j of batch b, key/value head h_kv is (b * Hkv + h_kv) *
// Sk + j. Results are packed, row n of the list at n * head_dim.

// Every query row's LSE_i (natural log, the sink's term included; the sink, or -inf without
// one, for a row with no visible key) and D_i = dO_i·O_i (0 there), in lse's layout
// [B][Hq][Sq]: what dk and dv of any key, and dsinks, need. O(Sq Sk D) per head,
// spread over std::thread::hardware_concurrency() threads (blocks of rows share each chunk of
// keys and values read from memory).
void attention_backward_row_stats(const AttentionShape& s, const float* q, const float* k, const float* v,
                                  const float* dout, double* lse, double* delta);

// dq and its spread (dq_spread may be null) of the `count` query rows rows[0..count), into
// [count][D]. Each row computes its own LSE and D: O(Sk D) per row.
void attention_backward_dq_rows(const AttentionShape& s, const float* q, const float* k, const float* v,
                                const float* dout, const int64_t* rows, int64_t count, double* dq,
                                double* dq_spread = nullptr);

// dk and dv and their spreads (null to skip) of the `count` keys keys[0..count), into
// [count][D], from every row's LSE and D (attention_backward_row_stats): O(group Sq D) per key.
void attention_backward_dkv_rows(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 const float* dout, const double* lse, const double* delta, const int64_t* keys,
                                 int64_t count, double* dk, double* dv, double* dk_spread = nullptr,
                                 double* dv_spread = nullptr);

// dsinks [Hq] from every row's LSE and D (attention_backward_row_stats): the code
// attention_backward runs, so the same bits. Zeros without s.sinks. O(B Sq) per head.
void attention_backward_dsinks(const AttentionShape& s, const double* lse, const double* delta, double* dsinks);

// How far `got` (a GPU result widened to float) is from `want` (the reference).
struct ErrorStats {
  double rel_l2 = 0;         // ||got - want|| / ||want||; infinite if any got is NaN
  double max_abs = 0;        // largest |got - want|; infinite if any got is NaN
  int64_t nan_count = 0;     // NaNs in got
  int64_t worst_index = -1;  // where max_abs occurs (the first NaN if there is one); -1 if n == 0
};

// Infinite `want` values (the -inf lse of rows with no visible key) match only an identical
// `got` and are left out of both norms; any other `got` there counts as an infinite error.
// If ||want|| is zero, rel_l2 is 0 when got matches exactly and infinite otherwise.
ErrorStats compare(const float* got, const double* want, int64_t n);

}  // namespace warpattn::reference
