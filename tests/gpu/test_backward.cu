// GPU tests of warpattn::backward against the fp64 reference backward, on fresh random data:
// the forward runs first (its out and lse are the backward's inputs, as in training), dq, dk
// and dv are poisoned (NaN) before every run, and padded strides check that nothing outside
// the views is written. Skips with the reason where no sm_90 GPU exists.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <span>

#include "gpu_test_support.cuh"
#include "hopper/backward/backward_config.hpp"
#include "hopper/backward/key_block_work.hpp"
#include "hopper/backward/tail_split.hpp"
#include "reference/reference.hpp"

using gpu_test::DeviceBuffer;
using gpu_test::DeviceTensor;
using warpattn::DType;

namespace {

struct Case {
  DType dtype = DType::bf16;
  int head_dim = 128;
  bool causal = false;
  int64_t batch = 1, seqlen_q = 256, seqlen_k = 256, heads_q = 2, heads_kv = 2;
  bool padded = false;
  bool deterministic = false;
  std::optional<float> softmax_scale;
  int window_left = -1, window_right = -1;  // a sliding window (issue 19)
  float softcap = 0;                          // and a softcap (at 64 and below in the 128 kernel)
  bool sinks = false;                         // sinks N(1, 2^2) per query head, and their gradient
  // q, k, v and dout's memory outside the view set to NaN before the fill: a padded head dim's
  // missing columns must come from TMA's zero fill, never from the gaps of strided tensors.
  bool nan_outside_inputs = false;
  // The call given its own workspace filled with 0x7F bytes (floats 3.4e38, counters 2^31 - 1
  // region-wide) instead of the pool's: every workspace row the kernels read must have been
  // written by this call (the row terms, the zeroed accumulator, the deterministic turns).
  bool garbage_workspace = false;
};

std::string describe(const Case& c) {
  char buf[220];
  snprintf(buf, sizeof buf, "%s d=%d %s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld%s%s", 
           c.dtype == DType::bf16 ? "bf16" : "fp16", c.head_dim, c.causal ? "causal" : "full", (long long)c.batch,
           (long long)c.seqlen_q, (long long)c.seqlen_k, (long long)c.heads_q, (long long)c.heads_kv,
           c.padded ? " strided" : "", c.deterministic ? " deterministic" : "");
  return buf + gpu_test::describe_model_options(c.window_left, c.window_right, c.softcap, c.sinks);
}

// Everything one run leaves behind: the inputs as the GPU saw them and the three gradients.
struct Run {
  std::vector<float> q, k, v, dout;
  std::vector<uint16_t> dq, dk, dv;  // raw allocations (views inside)
  int64_t written_outside = 0;
};

struct Tensors {
  DeviceTensor q, k, v, out, dout, dq, dk, dv;
  DeviceBuffer lse, sinks, dsinks;
  std::vector<float> sinks_host;
  explicit Tensors(const Case& c)
      : q(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.padded),
        k(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.padded),
        v(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.padded),
        out(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, false),
        dout(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.padded),
        dq(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.padded),
        dk(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.padded),
        dv(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.padded),
        lse(static_cast<size_t>(c.batch * c.heads_q * c.seqlen_q) * 4),
        sinks(static_cast<size_t>(c.heads_q) * 4),
        dsinks(static_cast<size_t>(c.heads_q) * 4) {}
  std::optional<warpattn::TensorView> sinks_view(const Case& c) {
    if (!c.sinks) return std::nullopt;
    return gpu_test::contiguous(sinks.mem, DType::f32, {c.heads_q});
  }
  std::optional<warpattn::TensorView> dsinks_view(const Case& c) {
    if (!c.sinks) return std::nullopt;
    return gpu_test::contiguous(dsinks.mem, DType::f32, {c.heads_q});
  }
  warpattn::TensorView lse_view(const Case& c) {
    return gpu_test::contiguous(lse.mem, DType::f32, {c.batch, c.heads_q, c.seqlen_q});
  }
};

// Forward, then backward, on the given inputs (fresh when seed is set).
void run_backward(const Case& c, Tensors& t, std::optional<uint64_t> seed) {
  if (seed) {
    t.q.fill_normal(*seed);
    t.k.fill_normal(*seed + 1);
    t.v.fill_normal(*seed + 2);
    t.dout.fill_normal(*seed + 3);
    if (c.sinks) {
      std::mt19937_64 draw(*seed + 4);
      std::normal_distribution<float> normal(1.f, 2.f);
      t.sinks_host.clear();
      for (int64_t h = 0; h < c.heads_q; ++h) t.sinks_host.push_back(normal(draw));
      cudaMemcpy(t.sinks.mem, t.sinks_host.data(), c.heads_q * 4, cudaMemcpyHostToDevice);
    }
  }
  cudaMemset(t.dsinks.mem, 0xFF, t.dsinks.bytes);  // NaN until written
  warpattn::ForwardOptions fo;
  fo.causal = c.causal;
  fo.softmax_scale = c.softmax_scale;
  fo.window_left = c.window_left, fo.window_right = c.window_right;
  fo.softcap = c.softcap;
  fo.sinks = t.sinks_view(c);
  warpattn::forward(t.q.view, t.k.view, t.v.view, t.out.view, t.lse_view(c), fo);
  t.dq.poison();
  t.dk.poison();
  t.dv.poison();
  warpattn::BackwardOptions bo;
  bo.causal = c.causal;
  bo.softmax_scale = c.softmax_scale;
  bo.deterministic = c.deterministic;
  bo.window_left = c.window_left, bo.window_right = c.window_right;
  bo.softcap = c.softcap;
  bo.sinks = t.sinks_view(c), bo.dsinks = t.dsinks_view(c);
  if (c.garbage_workspace) {
    DeviceBuffer workspace(warpattn::backward_workspace_bytes(t.q.view, bo), 0x7F);
    warpattn::backward(t.dout.view, t.q.view, t.k.view, t.v.view, t.out.view, t.lse_view(c), t.dq.view, t.dk.view,
                       t.dv.view, bo, warpattn::Workspace{workspace.mem, workspace.bytes});
    cudaDeviceSynchronize();  // before the buffer goes
    return;
  }
  warpattn::backward(t.dout.view, t.q.view, t.k.view, t.v.view, t.out.view, t.lse_view(c), t.dq.view, t.dk.view,
                     t.dv.view, bo);
}

// A fault planted through the inputs, to show the checks catch what a broken kernel would do:
// out negated (D = rowsum(dO ∘ O) off by a sign), or dO zero on one 64-row query block (as if
// the kernel skipped that block). The reference keeps the true inputs.
enum class Fault { none, d_sign, skipped_query_block };

// How far one gradient is from the reference, against its error model: the 16-bit rounding of
// each result element and of the operands each term of its sums carries (P and dS are rounded
// to 16 bits for the GEMMs), u / sqrt(3) relative each (u the unit roundoff of the dtype):
//   model = u / sqrt(3) · sqrt(||want||² + ||spread||²)
// with the reference's per-element spread sqrt(Σ term²). The floor covers gradients that are
// exactly zero in the reference (one key per row: dS = 0) and are left with fp32 cancellation.
struct GradientError {
  double err = 0, model = 0;
  int64_t nan = 0;
  bool within(double margin) const { return nan == 0 && err <= margin * model; }
};

GradientError compare(const Case& c, const std::vector<float>& got, const std::vector<double>& want,
                      const std::vector<double>& spread) {
  const double u = c.dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  GradientError e;
  double want2 = 0, spread2 = 0, err2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) ++e.nan;
    want2 += want[i] * want[i];
    spread2 += spread[i] * spread[i];
    err2 += (got[i] - want[i]) * (got[i] - want[i]);
  }
  e.err = std::sqrt(err2);
  e.model = u / std::sqrt(3.0) * std::sqrt(want2 + spread2) + 1e-6 * std::sqrt(double(got.size()));
  return e;
}

GradientError compare(const Case& c, const DeviceTensor& t, const std::vector<uint16_t>& raw,
                      const std::vector<double>& want, const std::vector<double>& spread) {
  return compare(c, t.logical(raw), want, spread);
}

// D's rounding, a term of dq's model: the backward takes D_i = dO_i·O_i from the forward's O,
// rounded to 16 bits, so D_i is off by about u/sqrt(3) · sqrt(Σ_d (dO_id O_id)²), and every dS_ij
// of the row by P_ij times that: dq_i moves by scale · δD_i · (P K)_i. Unlike the rest of dq_i,
// which cancels over the row's keys (Σ_j dS_ij = 0), this does not: rows that see few keys
// (the start of a causal sequence) are mostly that cancellation, and their measured error was
// 2x the model without the term (run 98). (FlashAttention and cuDNN take D from O the same way.)
// Adds scale · sqrt(Σ_d (dO_d O_d)²) · (P K)_d in quadrature to the spread of query row i of
// batch b, head h (the model multiplies the spread by u/sqrt(3)). `out`: the GPU's O.
void add_d_rounding(const warpattn::reference::AttentionShape& s, const std::vector<float>& q,
                    const std::vector<float>& k, const std::vector<float>& out, const std::vector<float>& dout,
                    int64_t b, int64_t h, int64_t i, double* spread_row) {
  const int64_t D = s.head_dim, at = ((b * s.seqlen_q + i) * s.heads_q + h) * D;
  double dd = 0;
  for (int64_t d = 0; d < D; ++d) dd += double(dout[at + d]) * out[at + d] * double(dout[at + d]) * out[at + d];
  std::vector<double> pk(D);
  warpattn::reference::attention_row(s, q.data(), k.data(), k.data(), b, h, i, pk.data(), nullptr);  // P·K
  for (int64_t d = 0; d < D; ++d) spread_row[d] = std::hypot(spread_row[d], s.softmax_scale * std::sqrt(dd) * pk[d]);
}

// The measured error may exceed the model by this factor (fp32 accumulation and exp2's
// approximation are not in it).
constexpr double kModelMargin = 1.5;

struct Outcome {
  GradientError dq, dk, dv;
  int64_t written_outside = 0;
  // The sinks' gradient: the largest |got - want| over the heads, against 1e-2 of the sum of its
  // terms' magnitudes (sum_i exp(sink - LSE_i) |D_i|), which D's 16-bit rounding stays well below.
  double dsinks_err = 0, dsinks_bound = 1;
  bool within() const {
    return dq.within(kModelMargin) && dk.within(kModelMargin) && dv.within(kModelMargin) && written_outside == 0 &&
           dsinks_err <= dsinks_bound;
  }
};

Outcome run_and_compare(const Case& c, Fault fault = Fault::none) {
  const uint64_t seed = gpu_test::fresh_seed();
  Tensors t(c);
  if (c.nan_outside_inputs) t.q.poison(), t.k.poison(), t.v.poison(), t.dout.poison();
  t.q.fill_normal(seed);
  t.k.fill_normal(seed + 1);
  t.v.fill_normal(seed + 2);
  t.dout.fill_normal(seed + 3);
  if (c.sinks) {
    std::mt19937_64 draw(seed + 4);
    std::normal_distribution<float> normal(1.f, 2.f);
    for (int64_t h = 0; h < c.heads_q; ++h) t.sinks_host.push_back(normal(draw));
    cudaMemcpy(t.sinks.mem, t.sinks_host.data(), c.heads_q * 4, cudaMemcpyHostToDevice);
  }
  const std::vector<float> q = t.q.logical(t.q.raw()), k = t.k.logical(t.k.raw()), v = t.v.logical(t.v.raw()),
                           dout = t.dout.logical(t.dout.raw());
  if (fault == Fault::skipped_query_block) {
    auto raw = t.dout.raw();
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t r = 64; r < std::min<int64_t>(128, c.seqlen_q); ++r)
        for (int64_t h = 0; h < c.heads_q; ++h)
          for (int64_t d = 0; d < c.head_dim; ++d)
            raw[b * t.dout.view.stride[0] + r * t.dout.view.stride[1] + h * t.dout.view.stride[2] + d] = 0;
    t.dout.upload(raw);
  }
  run_backward(c, t, std::nullopt);
  if (fault == Fault::d_sign) {  // again, with out negated (sign bit of every 16-bit value)
    auto raw = t.out.raw();
    for (auto& x : raw) x ^= 0x8000;
    t.out.upload(raw);
    warpattn::BackwardOptions bo;
    bo.causal = c.causal;
    bo.softmax_scale = c.softmax_scale;
    bo.window_left = c.window_left, bo.window_right = c.window_right;
    bo.softcap = c.softcap;
    t.dq.poison();
    t.dk.poison();
    t.dv.poison();
    warpattn::backward(t.dout.view, t.q.view, t.k.view, t.v.view, t.out.view, t.lse_view(c), t.dq.view,
                       t.dk.view, t.dv.view, bo);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    CHECK(false) << describe(c) << ": " << cudaGetErrorString(e);
    return {};
  }
  const auto dq_raw = t.dq.raw(), dk_raw = t.dk.raw(), dv_raw = t.dv.raw();
  warpattn::reference::AttentionShape s;
  s.batch = c.batch;
  s.seqlen_q = c.seqlen_q;
  s.seqlen_k = c.seqlen_k;
  s.heads_q = c.heads_q;
  s.heads_kv = c.heads_kv;
  s.head_dim = c.head_dim;
  s.softmax_scale = c.softmax_scale ? *c.softmax_scale : 1.0 / std::sqrt(double(c.head_dim));
  s.causal = c.causal;
  s.window_left = c.window_left, s.window_right = c.window_right;
  s.softcap = c.softcap;
  s.sinks = c.sinks ? t.sinks_host.data() : nullptr;
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), sq(q.size()), sk(k.size()), sv(v.size());
  std::vector<double> dsinks_want(c.heads_q);
  warpattn::reference::attention_backward(s, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                                          dv.data(), {sq.data(), sk.data(), sv.data()},
                                          c.sinks ? dsinks_want.data() : nullptr);
  const std::vector<float> out = t.out.logical(t.out.raw());
  gpu_test::parallel_for(c.batch * c.seqlen_q * c.heads_q, [&](int64_t r) {
    const int64_t h = r % c.heads_q, i = (r / c.heads_q) % c.seqlen_q, b = r / c.heads_q / c.seqlen_q;
    add_d_rounding(s, q, k, out, dout, b, h, i, &sq[r * c.head_dim]);
  });
  Outcome o;
  o.dq = compare(c, t.dq, dq_raw, dq, sq);
  o.dk = compare(c, t.dk, dk_raw, dk, sk);
  o.dv = compare(c, t.dv, dv_raw, dv, sv);
  o.written_outside =
      t.dq.written_outside_view(dq_raw) + t.dk.written_outside_view(dk_raw) + t.dv.written_outside_view(dv_raw);
  if (c.sinks) {
    const std::vector<float> got = t.dsinks.get<float>();
    std::vector<double> lse_ref(c.batch * c.heads_q * c.seqlen_q), delta(lse_ref.size());
    warpattn::reference::attention_backward_row_stats(s, q.data(), k.data(), v.data(), dout.data(), lse_ref.data(),
                                                      delta.data());
    o.dsinks_err = 0, o.dsinks_bound = INFINITY;
    for (int64_t h = 0; h < c.heads_q; ++h) {
      double magnitude = 0;
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t i = 0; i < c.seqlen_q; ++i) {
          const int64_t r = (b * c.heads_q + h) * c.seqlen_q + i;
          magnitude += std::exp(t.sinks_host[h] - lse_ref[r]) * std::fabs(delta[r]);
        }
      const double err = std::isnan(got[h]) ? INFINITY : std::fabs(got[h] - dsinks_want[h]);
      // Each head against its own bound: the worst ratio is kept as err / bound.
      o.dsinks_err = std::max(o.dsinks_err, err / (1e-2 * magnitude + 1e-6));
    }
    o.dsinks_bound = 1;
    printf("  %-62s dsinks err/bound %.3f\n", describe(c).c_str(), o.dsinks_err);
  }
  printf("  %-62s err/model dq %.2f dk %.2f dv %.2f%s (seed %llu)\n", describe(c).c_str(), o.dq.err / o.dq.model,
         o.dk.err / o.dk.model, o.dv.err / o.dv.model,
         fault == Fault::d_sign ? " [D sign fault]" : fault == Fault::skipped_query_block ? " [skipped block]" : "",
         (unsigned long long)seed);
  if (c.deterministic) {  // the same bits again, on the same inputs
    const std::vector<float> dsinks_first = t.dsinks.get<float>();
    run_backward(c, t, std::nullopt);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(t.dq.raw() == dq_raw && t.dk.raw() == dk_raw && t.dv.raw() == dv_raw &&
          std::memcmp(dsinks_first.data(), t.dsinks.get<float>().data(), t.dsinks.bytes) == 0)
        << describe(c) << ": deterministic mode gave different bits on a second run";
  }
  return o;
}

void check_case(const Case& c) {
  const Outcome o = run_and_compare(c);
  CHECK(o.within()) << describe(c) << ": err/model dq " << o.dq.err / o.dq.model << " dk " << o.dk.err / o.dk.model
                    << " dv " << o.dv.err / o.dv.model << " (NaN " << o.dq.nan + o.dk.nan + o.dv.nan
                    << "), written outside the views " << o.written_outside << ", margin " << kModelMargin
                    << ", dsinks err/bound " << o.dsinks_err;
}

void run_matrix(DType dtype, int head_dim, bool causal) {
  REQUIRE_HOPPER();
  const std::vector<std::array<int64_t, 5>> shapes = {
      // B, Sq, Sk, Hq, Hkv
      {1, 256, 256, 2, 2}, {2, 128, 384, 4, 2}, {1, 384, 128, 4, 1}, {1, 1, 1, 2, 2},   {1, 17, 300, 2, 2},
      {1, 300, 17, 2, 1},  {2, 257, 129, 2, 2}, {1, 1000, 999, 3, 1}, {1, 64, 4097, 1, 1},
  };
  for (const auto& sh : shapes) {
    Case c;
    c.dtype = dtype;
    c.head_dim = head_dim;
    c.causal = causal;
    c.batch = sh[0];
    c.seqlen_q = sh[1];
    c.seqlen_k = sh[2];
    c.heads_q = sh[3];
    c.heads_kv = sh[4];
    c.padded = sh[1] % 2 == 1;
    check_case(c);
  }
}

// A case of the model options (issue 19): the shape and options; dtype and head dim given apart.
struct ModelCase {
  int64_t sq, sk;
  bool causal;
  int left, right;
  float softcap;
  bool sinks, deterministic;
};

void run_model_cases(DType dtype, int head_dim, std::initializer_list<ModelCase> cases) {
  for (const ModelCase& w : cases) {
    Case c;
    c.dtype = dtype, c.head_dim = head_dim, c.causal = w.causal, c.deterministic = w.deterministic;
    c.seqlen_q = w.sq, c.seqlen_k = w.sk, c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.padded = w.sq % 2 == 1;
    c.window_left = w.left, c.window_right = w.right, c.softcap = w.softcap, c.sinks = w.sinks;
    check_case(c);
  }
}

// Sliding windows: the key blocks meet query-block intervals that no longer start at block 0,
// the mask has a left edge, and deterministic mode orders dQ's sums from each query block's last
// key block. Windows narrower than a block and wider, causal and not, Sq != Sk.
void run_window_matrix(DType dtype, int head_dim) {
  REQUIRE_HOPPER();
  run_model_cases(dtype, head_dim,
                  {{1000, 1000, true, 256, -1, 0, false, false}, {1000, 1000, true, 100, 0, 0, false, true},
                   {700, 700, false, 64, 64, 0, false, false},   {300, 900, false, -1, 50, 0, false, true},
                   {900, 300, true, 500, 0, 0, false, false},    {513, 513, false, 0, 0, 0, false, true},
                   {257, 1000, false, 200, -1, 0, false, false}});
}

// Softcap's gradient through tanh (at head dims 64 and below the 128 kernel runs it, its columns
// past the head dim zero-filled), alone and with a window, causal and not, and deterministic.
void run_softcap_matrix(DType dtype, int head_dim) {
  REQUIRE_HOPPER();
  run_model_cases(dtype, head_dim,
                  {{1000, 1000, false, -1, -1, 30, false, false}, {1000, 1000, true, -1, -1, 50, false, true},
                   {300, 900, true, 200, -1, 20, false, false},   {513, 257, false, 100, -1, 5, false, false}});
}

// Deterministic mode over one GQA shape, causal and not, at each dtype and head dim given: within
// the error model, and bitwise repeatable (run_and_compare runs it twice on the same inputs).
void run_deterministic_matrix(std::initializer_list<DType> dtypes, std::initializer_list<int> head_dims) {
  REQUIRE_HOPPER();
  for (DType dtype : dtypes)
    for (int d : head_dims)
      for (bool causal : {false, true}) {
        Case c;
        c.dtype = dtype, c.head_dim = d, c.causal = causal, c.deterministic = true;
        c.batch = 2, c.seqlen_q = 700, c.seqlen_k = 900, c.heads_q = 4, c.heads_kv = 2;
        check_case(c);
      }
}

// The checks must have teeth at each head dim given: a causal GQA case with D's sign flipped, or
// with a query block's dO zeroed, must fail them.
void run_planted_faults(std::initializer_list<int> head_dims) {
  REQUIRE_HOPPER();
  for (int d : head_dims)
    for (Fault fault : {Fault::d_sign, Fault::skipped_query_block}) {
      Case c;
      c.head_dim = d, c.causal = true, c.heads_q = 4, c.heads_kv = 2;
      CHECK(!run_and_compare(c, fault).within()) << describe(c) << ": a planted fault passed the checks";
    }
}

// The shapes of the padded head dims' tests: GQA and MHA, Sq != Sk both ways, one query row,
// f16 in one; strided or not, causal or not.
struct PaddedShape {
  int64_t batch, sq, sk, hq, hkv;
  bool causal, padded;
  DType dtype;
};
constexpr PaddedShape kPaddedShapes[] = {
    {2, 77, 77, 4, 4, false, true, DType::bf16},  {1, 300, 513, 4, 2, true, false, DType::bf16},
    {1, 513, 300, 4, 1, false, true, DType::f16}, {2, 1, 77, 2, 2, true, false, DType::bf16},
    {1, 257, 129, 2, 2, true, true, DType::bf16},
};

// Each padded head dim over each shape, with NaN in q, k, v and dout outside their views, so that
// a missing column read from anywhere but TMA's zero fill shows.
void run_padded_head_dims(std::initializer_list<int> head_dims, std::span<const PaddedShape> shapes) {
  for (int d : head_dims)
    for (const PaddedShape& sh : shapes) {
      Case c;
      c.dtype = sh.dtype, c.head_dim = d, c.causal = sh.causal;
      c.batch = sh.batch, c.seqlen_q = sh.sq, c.seqlen_k = sh.sk, c.heads_q = sh.hq, c.heads_kv = sh.hkv;
      c.padded = sh.padded;
      c.nan_outside_inputs = true;
      check_case(c);
    }
}

// Deterministic mode at a padded head dim (its own dq order): within the model, bitwise repeatable.
void check_padded_deterministic(int head_dim, bool causal) {
  Case c;
  c.head_dim = head_dim, c.causal = causal, c.deterministic = true;
  c.batch = 2, c.seqlen_q = 300, c.seqlen_k = 500, c.heads_q = 4, c.heads_kv = 2, c.padded = true;
  c.nan_outside_inputs = true;
  check_case(c);
}

}  // namespace

TEST(backward_window_bf16_d64) { run_window_matrix(DType::bf16, 64); }
TEST(backward_window_bf16_d128) { run_window_matrix(DType::bf16, 128); }
TEST(backward_window_bf16_d256) { run_window_matrix(DType::bf16, 256); }
// Sinks and their gradient, with the other options; Sq > Sk causal leaves rows with only the sink.
TEST(backward_sinks) {
  REQUIRE_HOPPER();
  run_model_cases(DType::bf16, 128, {{1000, 1000, false, -1, -1, 0, true, false}, {900, 300, true, -1, -1, 0, true, false}});
  run_model_cases(DType::bf16, 64, {{700, 700, true, -1, -1, 0, true, true}});
  run_model_cases(DType::bf16, 256, {{300, 900, true, 200, -1, 0, true, false}});
  run_model_cases(DType::f16, 128, {{513, 257, false, 100, -1, 30, true, false}});
}
TEST(backward_softcap_bf16_d64) { run_softcap_matrix(DType::bf16, 64); }
TEST(backward_softcap_f16_d64) { run_softcap_matrix(DType::f16, 64); }
TEST(backward_softcap_bf16_d128) { run_softcap_matrix(DType::bf16, 128); }
TEST(backward_softcap_bf16_d256) { run_softcap_matrix(DType::bf16, 256); }
TEST(backward_softcap_f16_d128) { run_softcap_matrix(DType::f16, 128); }

TEST(backward_bf16_d64_full) { run_matrix(DType::bf16, 64, false); }
TEST(backward_bf16_d64_causal) { run_matrix(DType::bf16, 64, true); }
TEST(backward_bf16_d128_full) { run_matrix(DType::bf16, 128, false); }
TEST(backward_bf16_d128_causal) { run_matrix(DType::bf16, 128, true); }
TEST(backward_f16_d64_full) { run_matrix(DType::f16, 64, false); }
TEST(backward_f16_d128_causal) { run_matrix(DType::f16, 128, true); }
TEST(backward_bf16_d256_full) { run_matrix(DType::bf16, 256, false); }
TEST(backward_bf16_d256_causal) { run_matrix(DType::bf16, 256, true); }
TEST(backward_f16_d256_causal) { run_matrix(DType::f16, 256, true); }

// The causal d = 256 backward's longest-first order (backward_config.hpp,
// WARPATTN_TUNE_BWD_LONGEST_FIRST_MB) in more than one group of rows: the matrix's shapes all fit
// one group, where the order is key block outer over every row. Here each (batch, KV head) row's
// Q, dO and dQ accumulator (8 query heads of 1300 rows: 21 MB) needs a group of its own, so the
// launch walks three groups one after another, and each CTA's (key block, batch, KV head) comes
// from grouped_longest_first's group search (CPU-tested as a permutation in test_kv_tiles.cpp).
TEST(backward_d256_causal_longest_first_over_groups) {
  REQUIRE_HOPPER();
  Case c;
  c.head_dim = 256, c.causal = true;
  c.batch = 3, c.seqlen_q = c.seqlen_k = 1300, c.heads_q = 8, c.heads_kv = 1;
  const int groups = warpattn::detail::longest_first_groups(
      static_cast<int>(c.batch * c.heads_kv), static_cast<int>(c.heads_q / c.heads_kv), static_cast<int>(c.seqlen_q),
      c.head_dim, int64_t{WARPATTN_TUNE_BWD_LONGEST_FIRST_MB} << 20);
  REQUIRE(WARPATTN_TUNE_BWD_LONGEST_FIRST_MB == 0 || groups == 3)
      << groups << " groups: the shape no longer exercises several (" << WARPATTN_TUNE_BWD_LONGEST_FIRST_MB << " MB)";
  check_case(c);
}

TEST(backward_deterministic_is_bitwise_repeatable) { run_deterministic_matrix({DType::bf16}, {64, 128, 256}); }

// The tail split (tail_split.hpp, tail_fixup.cuh), forced at small shapes through
// WARPATTN_BWD_TAIL_SPLIT="tiles,parts": the launch's last tiles cut into parts over their query
// steps, whose partial dK and dV the part that finishes last adds up. One step a part, several,
// and parts without a step (more parts than steps); GQA, odd lengths, Sq != Sk both ways, both
// 16-bit types, the head dims whose kernels split (d = 64, 128 and 256 without a band; 256 with
// its own consumer, backward_consumer_n80.cuh).
TEST(backward_tail_split) {
  REQUIRE_HOPPER();
  struct Forced {
    const char* cut;
    DType dtype;
    int head_dim;
    std::array<int64_t, 5> shape;  // B, Sq, Sk, Hq, Hkv
  };
  const Forced cases[] = {
      {"5,3", DType::bf16, 128, {2, 257, 300, 4, 2}},  {"12,8", DType::bf16, 128, {2, 257, 300, 4, 2}},
      {"3,12", DType::f16, 128, {2, 257, 300, 4, 2}},  {"10,2", DType::f16, 128, {1, 64, 4097, 1, 1}},
      {"8,5", DType::bf16, 64, {1, 1000, 999, 3, 1}},  {"2,4", DType::f16, 64, {2, 129, 384, 4, 4}},
      {"40,3", DType::bf16, 64, {1, 384, 128, 4, 1}},  {"6,3", DType::bf16, 256, {2, 257, 300, 4, 2}},
      {"16,11", DType::f16, 256, {2, 257, 300, 4, 2}}, {"10,2", DType::bf16, 256, {1, 64, 4097, 1, 1}},
  };
  for (const Forced& f : cases) {
    REQUIRE(setenv("WARPATTN_BWD_TAIL_SPLIT", f.cut, 1) == 0);
    // the launch's own choice under the variable: the forced cut (clamped to the tiles)
    const warpattn::detail::TailSplit t = warpattn::detail::backward_tail_split(100, 10, 132);
    REQUIRE(t.split_tiles == std::min(100, std::atoi(f.cut)) && t.parts == std::atoi(std::strchr(f.cut, ',') + 1))
        << "WARPATTN_BWD_TAIL_SPLIT=" << f.cut << " read as " << t.split_tiles << " tiles in " << t.parts << " parts";
    Case c;
    c.dtype = f.dtype, c.head_dim = f.head_dim;
    c.batch = f.shape[0], c.seqlen_q = f.shape[1], c.seqlen_k = f.shape[2], c.heads_q = f.shape[3],
    c.heads_kv = f.shape[4];
    c.padded = c.seqlen_q % 2 == 1;
    const Outcome o = run_and_compare(c);
    CHECK(o.within()) << describe(c) << " tail split " << f.cut << ": err/model dq " << o.dq.err / o.dq.model << " dk "
                      << o.dk.err / o.dk.model << " dv " << o.dv.err / o.dv.model << " (NaN "
                      << o.dq.nan + o.dk.nan + o.dv.nan << ")";
  }
  unsetenv("WARPATTN_BWD_TAIL_SPLIT");
}

// A workspace the call did not clear (0x7F bytes), at lengths where the workspace's padded rows
// (a multiple of 320 at d = 128, 128 elsewhere) pass the rows the main kernel covers, which the
// row terms and the conversion stop at (run_backward): 1000 rows is 1280 at d = 128 against
// 1040 covered, 4100 at d = 256 4224 against 4160; default and deterministic, causal and not.
TEST(backward_workspace_past_covered_rows) {
  REQUIRE_HOPPER();
  for (int d : {64, 128, 256})
    for (int64_t n : {1000, 4100})
      for (bool deterministic : {false, true}) {
        Case c;
        c.head_dim = d, c.causal = n == 1000, c.deterministic = deterministic, c.garbage_workspace = true;
        c.batch = 2, c.seqlen_q = n, c.seqlen_k = n == 1000 ? 1000 : 300, c.heads_q = 2, c.heads_kv = 1;
        check_case(c);
      }
}

// Head dims between and below the kernels' (any multiple of 8 from 8 to 256; above 256: the
// d512 tests below), each run in the d = 64, 128 or 256 kernel with the missing columns zero-filled: dq, dk and dv written only in
// their real columns (strided cases: a padded column's write lands in the head stride's gap),
// the default scale 1/sqrt of the real d (the reference's). Causal and not, Sq != Sk both ways,
// GQA and MHA, f16 in one shape; small shapes, the fp64 reference backward being the cost.
TEST(backward_padded_head_dims) {
  REQUIRE_HOPPER();
  run_padded_head_dims({8, 40, 80, 96, 112, 160, 192, 248}, kPaddedShapes);
  // Deterministic mode, one padded d per kernel.
  for (int d : {40, 80, 200}) check_padded_deterministic(d, /*causal=*/d != 80);
  // An explicit scale replaces 1/sqrt(d).
  Case scaled;
  scaled.head_dim = 96, scaled.softmax_scale = 0.3f, scaled.causal = true, scaled.nan_outside_inputs = true;
  check_case(scaled);
}

// The window, sinks and softcap at padded head dims, every size (softcap at 40 and 16 in the
// 128 kernel).
TEST(backward_padded_head_dims_window_softcap_sinks) {
  REQUIRE_HOPPER();
  run_model_cases(DType::bf16, 40,
                  {{700, 700, true, 100, 0, 0, true, false}, {300, 900, false, 64, 64, 0, false, true},
                   {700, 700, false, -1, -1, 30, false, false}, {513, 257, true, 100, -1, 20, true, true}});
  run_model_cases(DType::f16, 16, {{300, 900, true, -1, -1, 10, false, false}});
  run_model_cases(DType::bf16, 80,
                  {{700, 700, false, -1, -1, 30, false, false}, {513, 257, true, 100, -1, 20, true, false},
                   {300, 900, true, 200, -1, 0, true, true}});
  run_model_cases(DType::f16, 200,
                  {{700, 700, true, -1, -1, 50, false, true}, {257, 700, false, 128, 5, 30, true, false}});
}

TEST(backward_planted_faults_fail) { run_planted_faults({64, 128, 256}); }

TEST(backward_custom_scale) {
  REQUIRE_HOPPER();
  Case c;
  c.softmax_scale = 0.3f;
  c.causal = true;
  check_case(c);
}

// No query rows: dk = dv = 0. No keys: dq = 0 (the forward gave out = 0, lse = -inf).
TEST(backward_empty_sequences) {
  REQUIRE_HOPPER();
  for (const auto& [sq, sk] : {std::pair<int64_t, int64_t>{0, 100}, {100, 0}})
    for (bool causal : {false, true}) {
      Case c;
      c.seqlen_q = sq;
      c.seqlen_k = sk;
      c.causal = causal;
      c.padded = true;
      check_case(c);
    }
}

// ---- head dim 512, and the padded head dims 264..504 that run in its kernel: two CTAs per key
// block (one per half of the head dim's columns of dK, dV and dQ), 32-row query blocks, dQ
// computed transposed (docs/headdim512-design.md, "The backward at 512"). The same error model
// and margin as every other head dim. Built on a machine without a GPU: the first run's checks
// (`./build/test_gpu_backward d512` runs every test below, each name contains "d512").
TEST(backward_bf16_d512_full) { run_matrix(DType::bf16, 512, false); }
TEST(backward_bf16_d512_causal) { run_matrix(DType::bf16, 512, true); }
TEST(backward_f16_d512_full) { run_matrix(DType::f16, 512, false); }
TEST(backward_f16_d512_causal) { run_matrix(DType::f16, 512, true); }

// The padded head dims above 256: the columns past d zero-filled on load (NaN outside the input
// views must not leak in) and never written (a CTA whose column half lies wholly past d, as the
// second one at 264, writes nothing); GQA and MHA, Sq != Sk both ways, f16 in one shape.
TEST(backward_d512_padded_head_dims) {
  REQUIRE_HOPPER();
  // The first four of the shapes: the tests at 512 were written without the fifth (257 x 129,
  // causal and strided).
  run_padded_head_dims({264, 320, 384, 488, 504}, std::span(kPaddedShapes).first(4));
  for (int d : {264, 384}) check_padded_deterministic(d, /*causal=*/d == 264);
}

// Deterministic mode at 512: the turn counters per 32-row block, both CTAs of a key block adding
// their column halves in the same turn; bitwise equal over two runs, within the error model.
TEST(backward_d512_deterministic_is_bitwise_repeatable) { run_deterministic_matrix({DType::bf16, DType::f16}, {512}); }

// The model options at 512: windows (query-block ranges not from 0, the mask's left edge),
// softcap (tanh's derivative), sinks and their gradient.
TEST(backward_window_bf16_d512) { run_window_matrix(DType::bf16, 512); }
TEST(backward_softcap_bf16_d512) { run_softcap_matrix(DType::bf16, 512); }
TEST(backward_d512_sinks) {
  REQUIRE_HOPPER();
  run_model_cases(DType::bf16, 512, {{300, 900, true, 200, -1, 0, true, false}, {900, 300, true, -1, -1, 0, true, true}});
  run_model_cases(DType::f16, 512, {{513, 257, false, 100, -1, 30, true, false}});
}

// The checks have teeth at 512 too: D's sign flipped, a query block's dO zeroed.
TEST(backward_d512_planted_faults_fail) { run_planted_faults({512}); }

// ---- 64K tokens
//
// Sq = Sk = 65536, d = 128, bf16, one head: the backward at the length where long-context
// training runs it, where a loop bound or an index that overflows, or a sum that drifts, would
// show. The full fp64 reference is out of reach here (~5e11 multiply-adds per head, three times
// over), so the check samples: dq of 64 query rows and dk, dv of 64 keys (the first and last
// ones, those at the 64- and 128-row block edges, the middle, and random ones), from the sampled
// reference (reference::attention_backward_dq_rows, _dkv_rows: bitwise the full reference's
// values for those rows, from every row's LSE and D, computed once in fp64). Each gradient's
// sampled rows are held to the same error model and margin as above; dq, dk and dv are scanned
// whole for NaN and infinity. And the check must have teeth at this length: the same comparison
// against a reference with a planted 1-2% fault (dq: the softmax scale x 1.02, since the D-rounding
// term of the model left a 1% one at 1.76x the model in run 99, too near the margin; dk, dv: every P
// x 0.99, the LSE off by log(1/0.99)) must fail (simulated with model-sized errors: 3-4x the
// model against the faulty reference, ~0.9x against the true one). The reference's row
// statistics (O(S² d)) take nearly all of the time: measured ~65 ns per (row, key) pair and core
// (145 core-seconds causal on a 2-core EPYC VM), so ~290 core-seconds non-causal: ~20-25 s and
// ~10-13 s on the GPU host's 16 cores.
namespace {

std::vector<int64_t> sample_rows(int64_t n, std::mt19937_64& rng) {
  std::vector<int64_t> rows = {0, 1, 2, 63, 64, 127, 128, 129, 4095, 4096, n / 2, n - 129, n - 128, n - 65, n - 2, n - 1};
  while (rows.size() < 64) {
    const int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    if (std::find(rows.begin(), rows.end(), r) == rows.end()) rows.push_back(r);
  }
  return rows;
}

// The GPU's values of the listed rows of a (1, S, 1, D) gradient, packed as the reference packs them.
std::vector<float> rows_of(const std::vector<float>& all, const std::vector<int64_t>& rows, int64_t d) {
  std::vector<float> got(rows.size() * d);
  for (size_t n = 0; n < rows.size(); ++n) std::copy_n(&all[rows[n] * d], d, &got[n * d]);
  return got;
}

void check_backward_64k(bool causal) {
  REQUIRE_HOPPER();
  Case c;
  c.head_dim = 128;
  c.causal = causal;
  c.seqlen_q = c.seqlen_k = 65536;
  c.heads_q = c.heads_kv = 1;
  const int64_t S = c.seqlen_q, D = c.head_dim;
  const uint64_t seed = gpu_test::fresh_seed();
  Tensors t(c);
  run_backward(c, t, seed);
  const cudaError_t e = cudaDeviceSynchronize();
  REQUIRE(e == cudaSuccess) << describe(c) << ": " << cudaGetErrorString(e);
  const std::vector<float> dq_all = t.dq.logical(t.dq.raw()), dk_all = t.dk.logical(t.dk.raw()),
                           dv_all = t.dv.logical(t.dv.raw());
  auto non_finite = [](const std::vector<float>& x) {
    return std::count_if(x.begin(), x.end(), [](float y) { return !std::isfinite(y); });
  };
  const int64_t bad_dq = non_finite(dq_all), bad_dk = non_finite(dk_all), bad_dv = non_finite(dv_all);
  CHECK(bad_dq + bad_dk + bad_dv == 0) << describe(c) << ": NaN or infinite gradients: dq " << bad_dq << ", dk "
                                       << bad_dk << ", dv " << bad_dv << " (seed " << seed << ")";

  const std::vector<float> q = t.q.logical(t.q.raw()), k = t.k.logical(t.k.raw()), v = t.v.logical(t.v.raw()),
                           dout = t.dout.logical(t.dout.raw());
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> rows = sample_rows(S, rng), keys = sample_rows(S, rng);
  const int64_t n = static_cast<int64_t>(rows.size());  // as many keys
  warpattn::reference::AttentionShape s{1, S, S, 1, 1, D, 1.0 / std::sqrt(double(D)), causal};
  namespace ref = warpattn::reference;
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> dq(n * D), sq(n * D), dk(n * D), dv(n * D), sk(n * D), sv(n * D);
  ref::attention_backward_dq_rows(s, q.data(), k.data(), v.data(), dout.data(), rows.data(), n, dq.data(), sq.data());
  const std::vector<float> out = t.out.logical(t.out.raw());
  gpu_test::parallel_for(n, [&](int64_t r) { add_d_rounding(s, q, k, out, dout, 0, 0, rows[r], &sq[r * D]); });
  std::vector<double> lse(S), delta(S);
  ref::attention_backward_row_stats(s, q.data(), k.data(), v.data(), dout.data(), lse.data(), delta.data());
  ref::attention_backward_dkv_rows(s, q.data(), k.data(), v.data(), dout.data(), lse.data(), delta.data(), keys.data(),
                                   n, dk.data(), dv.data(), sk.data(), sv.data());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<float> got_dq = rows_of(dq_all, rows, D), got_dk = rows_of(dk_all, keys, D),
                           got_dv = rows_of(dv_all, keys, D);
  Outcome o;
  o.dq = compare(c, got_dq, dq, sq);
  o.dk = compare(c, got_dk, dk, sk);
  o.dv = compare(c, got_dv, dv, sv);
  printf("  %-62s err/model dq %.2f dk %.2f dv %.2f over %lld rows and keys (reference %.1f s; seed %llu)\n",
         describe(c).c_str(), o.dq.err / o.dq.model, o.dk.err / o.dk.model, o.dv.err / o.dv.model, (long long)n,
         seconds, (unsigned long long)seed);
  CHECK(o.within()) << describe(c) << ": err/model dq " << o.dq.err / o.dq.model << " dk " << o.dk.err / o.dk.model
                    << " dv " << o.dv.err / o.dv.model << ", margin " << kModelMargin << " (seed " << seed << ")";

  // The planted faults, on the reference side (cheap: 64 rows and keys, the row statistics kept).
  ref::AttentionShape wrong_scale = s;
  wrong_scale.softmax_scale *= 1.02;
  std::vector<double> fault_dq(n * D), fault_dk(n * D), fault_dv(n * D), shifted_lse(lse);
  ref::attention_backward_dq_rows(wrong_scale, q.data(), k.data(), v.data(), dout.data(), rows.data(), n,
                                  fault_dq.data());
  for (double& x : shifted_lse) x -= std::log(0.99);
  ref::attention_backward_dkv_rows(s, q.data(), k.data(), v.data(), dout.data(), shifted_lse.data(), delta.data(),
                                   keys.data(), n, fault_dk.data(), fault_dv.data());
  const GradientError f_dq = compare(c, got_dq, fault_dq, sq), f_dk = compare(c, got_dk, fault_dk, sk),
                      f_dv = compare(c, got_dv, fault_dv, sv);
  printf("  %-62s planted faults: err/model dq %.2f (scale x 1.02), dk %.2f dv %.2f (P x 0.99)\n",
         describe(c).c_str(), f_dq.err / f_dq.model, f_dk.err / f_dk.model, f_dv.err / f_dv.model);
  CHECK(!f_dq.within(kModelMargin) && !f_dk.within(kModelMargin) && !f_dv.within(kModelMargin))
      << describe(c) << ": a planted 1-2% fault passed the 64K checks";
}

}  // namespace

TEST(backward_64k_tokens_full) { check_backward_64k(false); }
TEST(backward_64k_tokens_causal) { check_backward_64k(true); }

HARNESS_MAIN()
