// GPU tests of warpattn::forward against the CPU reference, on fresh random data with the
// outputs poisoned (NaN) before every run. Skips with the reason where no sm_90 GPU exists.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <thread>

#include "gpu_test_support.cuh"
#include "reference/reference.hpp"

using gpu_test::DeviceTensor;
using gpu_test::parallel_for;
using warpattn::DType;

namespace {

struct Case {
  DType dtype = DType::bf16;
  int head_dim = 128;
  bool causal = false;
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 8, heads_kv = 8;
  bool padded = false;  // non-contiguous batch / sequence / head strides
  bool with_lse = true;
  std::optional<float> softmax_scale;  // default 1/sqrt(head_dim)
  int64_t first_rows = 4;  // rows 0 .. first_rows - 1 of every (b, h) are always checked
  bool score_jump = false;  // gpu_test::set_score_jump
  // Model options (issue 19): FlashAttention's window_size, softcap, and per-head sinks
  // (drawn N(sink_mean, 2^2) when on).
  int window_left = -1, window_right = -1;
  float softcap = 0;
  bool sinks = false;
  float sink_mean = 0;
  // Planted faults, in the reference only: its window one key narrower on the left, no sinks.
  bool fault_narrower_window = false, fault_no_sinks = false;
  // q, k and v's memory outside the view (the strided gaps, the allocation's tail) set to NaN
  // before the fill: a padded head dim's missing columns must come from TMA's zero fill, and a
  // kernel that read them from memory instead would turn the output NaN.
  bool nan_outside_inputs = false;
};

struct Outcome {
  double rel_l2 = 0, max_abs = 0, lse_max_err = 0;
  int64_t nan = 0, written_outside = 0, lse_written_outside = 0, rows = 0;
  std::string worst;  // where the largest error sits, for the failure message
};

std::string describe(const Case& c) {
  char buf[200];
  char scale[32] = "";
  if (c.softmax_scale) snprintf(scale, sizeof scale, " scale=%g", *c.softmax_scale);
  snprintf(buf, sizeof buf, "%s d=%d %s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld%s%s%s%s",
           c.dtype == DType::bf16 ? "bf16" : "fp16", c.head_dim, c.causal ? "causal" : "full",
           (long long)c.batch, (long long)c.seqlen_q, (long long)c.seqlen_k, (long long)c.heads_q,
           (long long)c.heads_kv, c.padded ? " strided" : "", c.with_lse ? "" : " no-lse", scale,
           c.score_jump ? " jump" : "");
  return buf + gpu_test::describe_model_options(c.window_left, c.window_right, c.softcap, c.sinks);
}

// The (b, h, row) triples to check: all of them when the reference is cheap, else the first
// and last rows of every (b, h) plus random ones.
std::vector<int64_t> rows_to_check(const Case& c, std::mt19937_64& rng) {
  std::vector<int64_t> rows;
  const double work = double(c.batch) * c.heads_q * c.seqlen_q * c.seqlen_k * c.head_dim;
  for (int64_t bh = 0; bh < c.batch * c.heads_q; ++bh) {
    if (work <= 3e8) {
      for (int64_t r = 0; r < c.seqlen_q; ++r) rows.push_back(bh * c.seqlen_q + r);
      continue;
    }
    std::vector<int64_t> pick = {c.seqlen_q - 2, c.seqlen_q - 1};
    for (int64_t r = 0; r < c.first_rows; ++r) pick.push_back(r);
    for (int i = 0; i < 60; ++i) pick.push_back(static_cast<int64_t>(rng() % c.seqlen_q));
    std::sort(pick.begin(), pick.end());
    pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
    for (int64_t r : pick)
      if (r >= 0 && r < c.seqlen_q) rows.push_back(bh * c.seqlen_q + r);
  }
  return rows;
}

Outcome run_case(const Case& c, uint64_t seed) {
  Outcome res;
  DeviceTensor q(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.padded);
  DeviceTensor k(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.padded);
  DeviceTensor v(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.padded);
  DeviceTensor out(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.padded);
  if (c.nan_outside_inputs) q.poison(), k.poison(), v.poison();
  q.fill_normal(seed);
  k.fill_normal(seed + 1);
  v.fill_normal(seed + 2);
  if (c.score_jump) gpu_test::set_score_jump(q, k);
  out.poison();
  // LSE with a padded row stride when the tensors are strided.
  const int64_t lse_row_stride = c.padded ? 2 : 1;
  const int64_t lse_head_stride = c.seqlen_q * lse_row_stride + (c.padded ? 4 : 0);
  const int64_t lse_elems = c.batch * c.heads_q * lse_head_stride + 8;
  float* lse_mem = nullptr;
  if (cudaMalloc(&lse_mem, lse_elems * 4) != cudaSuccess) throw std::runtime_error("cudaMalloc lse");
  cudaMemset(lse_mem, 0xFF, lse_elems * 4);
  std::optional<warpattn::TensorView> lse;
  if (c.with_lse) {
    warpattn::TensorView l;
    l.data = lse_mem;
    l.dtype = DType::f32;
    l.rank = 3;
    l.shape[0] = c.batch, l.shape[1] = c.heads_q, l.shape[2] = c.seqlen_q;
    l.stride[0] = c.heads_q * lse_head_stride, l.stride[1] = lse_head_stride, l.stride[2] = lse_row_stride;
    lse = l;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("setup failed");

  warpattn::ForwardOptions options;
  options.causal = c.causal;
  options.softmax_scale = c.softmax_scale;
  options.window_left = c.window_left, options.window_right = c.window_right;
  options.softcap = c.softcap;
  std::vector<float> sinks_host;
  gpu_test::DeviceBuffer sinks_mem(c.heads_q * 4);
  if (c.sinks) {
    std::mt19937_64 draw(seed + 3);
    std::normal_distribution<float> normal(c.sink_mean, 2.f);
    for (int64_t h = 0; h < c.heads_q; ++h) sinks_host.push_back(normal(draw));
    cudaMemcpy(sinks_mem.mem, sinks_host.data(), c.heads_q * 4, cudaMemcpyHostToDevice);
    options.sinks = gpu_test::contiguous(sinks_mem.mem, DType::f32, {c.heads_q});
  }
  warpattn::forward(q.view, k.view, v.view, out.view, lse, options, nullptr);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) throw std::runtime_error(std::string("kernel failed: ") + cudaGetErrorString(e));

  const auto out_raw = out.raw();
  res.written_outside = out.written_outside_view(out_raw);
  const auto got = out.logical(out_raw);
  std::vector<float> lse_host(lse_elems);
  cudaMemcpy(lse_host.data(), lse_mem, lse_elems * 4, cudaMemcpyDeviceToHost);
  cudaFree(lse_mem);

  const auto qf = q.logical(q.raw()), kf = k.logical(k.raw()), vf = v.logical(v.raw());
  warpattn::reference::AttentionShape shape{c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv,
                                            c.head_dim,
                                            c.softmax_scale ? double(*c.softmax_scale) : 1.0 / std::sqrt(double(c.head_dim)),
                                            c.causal};
  shape.window_left = c.window_left - (c.fault_narrower_window ? 1 : 0), shape.window_right = c.window_right;
  shape.softcap = c.softcap;
  shape.sinks = c.sinks && !c.fault_no_sinks ? sinks_host.data() : nullptr;
  std::mt19937_64 rng(seed);
  const auto rows = rows_to_check(c, rng);  // index = (b * Hq + h) * Sq + row
  const int64_t D = c.head_dim;
  std::vector<double> want(rows.size() * D), want_lse(rows.size());
  std::vector<float> got_rows(rows.size() * D), got_lse(rows.size());
  parallel_for(static_cast<int64_t>(rows.size()), [&](int64_t i) {
    const int64_t bh = rows[i] / c.seqlen_q, row = rows[i] % c.seqlen_q;
    const int64_t b = bh / c.heads_q, h = bh % c.heads_q;
    warpattn::reference::attention_row(shape, qf.data(), kf.data(), vf.data(), b, h, row,
                                       &want[i * D], &want_lse[i]);
    std::copy_n(&got[((b * c.seqlen_q + row) * c.heads_q + h) * D], D, &got_rows[i * D]);
    got_lse[i] = lse_host[b * c.heads_q * lse_head_stride + h * lse_head_stride + row * lse_row_stride];
  });
  const auto stats = warpattn::reference::compare(got_rows.data(), want.data(), static_cast<int64_t>(want.size()));
  res.rel_l2 = stats.rel_l2;
  res.max_abs = stats.max_abs;
  res.nan = stats.nan_count;
  res.rows = static_cast<int64_t>(rows.size());
  if (stats.worst_index >= 0) {
    const int64_t i = stats.worst_index / D, col = stats.worst_index % D;
    const int64_t bh = rows[i] / c.seqlen_q;
    char buf[160];
    snprintf(buf, sizeof buf, "worst at b=%lld h=%lld row=%lld col=%lld: got %g want %g",
             (long long)(bh / c.heads_q), (long long)(bh % c.heads_q), (long long)(rows[i] % c.seqlen_q),
             (long long)col, got_rows[stats.worst_index], want[stats.worst_index]);
    res.worst = buf;
  }
  if (c.with_lse) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const double w = want_lse[i], g = got_lse[i];
      const double err = std::isinf(w) ? (g == w ? 0.0 : INFINITY) : std::fabs(g - w);
      res.lse_max_err = std::max(res.lse_max_err, std::isnan(g) ? INFINITY : err);
    }
    // Every LSE slot outside the view must still hold the poison.
    std::vector<char> inside(lse_elems, 0);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t r = 0; r < c.seqlen_q; ++r)
          inside[b * c.heads_q * lse_head_stride + h * lse_head_stride + r * lse_row_stride] = 1;
    for (int64_t i = 0; i < lse_elems; ++i) {
      uint32_t bits;
      memcpy(&bits, &lse_host[i], 4);
      res.lse_written_outside += !inside[i] && bits != 0xFFFFFFFFu;
    }
  }
  return res;
}

double tolerance(DType t) { return t == DType::bf16 ? 5e-3 : 1e-3; }

void check_case(const Case& c) {
  const uint64_t seed = gpu_test::fresh_seed();
  const Outcome r = run_case(c, seed);
  const bool ok = r.nan == 0 && r.rel_l2 <= tolerance(c.dtype) && r.written_outside == 0 &&
                  (!c.with_lse || (r.lse_max_err <= 1e-4 && r.lse_written_outside == 0));
  printf("    %-58s rows %6lld  relL2 %.2e  max|d| %.2e  lse %.1e  %s\n", describe(c).c_str(),
         (long long)r.rows, r.rel_l2, r.max_abs, r.lse_max_err, ok ? "ok" : "FAIL");
  CHECK(r.nan == 0) << describe(c) << " NaN in output: " << r.nan << " seed " << seed;
  CHECK(r.rel_l2 <= tolerance(c.dtype)) << describe(c) << " rel L2 " << r.rel_l2 << " " << r.worst << " seed " << seed;
  CHECK(r.written_outside == 0) << describe(c) << " wrote " << r.written_outside << " elements outside out";
  if (c.with_lse) {
    CHECK(r.lse_max_err <= 1e-4) << describe(c) << " LSE error " << r.lse_max_err << " seed " << seed;
    CHECK(r.lse_written_outside == 0) << describe(c) << " wrote " << r.lse_written_outside << " outside lse";
  }
}

// The matrix of the issue: every GQA ratio (1, 4, all heads on one KV head) and sequence
// shape for one dtype x head dim x causal.
void run_matrix(DType dtype, int head_dim, bool causal) {
  REQUIRE_HOPPER();
  const int64_t seqlens[][2] = {{1, 1},       {17, 17},     {128, 128},   {1000, 1000}, {4097, 4097},
                                {16385, 16385}, {1000, 4097}, {4097, 1000}, {1, 1000},    {128, 17}};
  const int64_t kv_heads[] = {8, 2, 1};
  for (const auto& s : seqlens)
    for (int64_t hkv : kv_heads) {
      Case c;
      c.dtype = dtype, c.head_dim = head_dim, c.causal = causal;
      c.seqlen_q = s[0], c.seqlen_k = s[1];
      c.batch = std::max<int64_t>(s[0], s[1]) > 4096 ? 1 : 2;
      c.heads_q = 8, c.heads_kv = hkv;
      c.padded = hkv == 2;  // one ratio in three runs on non-contiguous strides
      check_case(c);
    }
}

// A shape with model options (issue 19): lengths, causal, window_size, softcap, sinks.
struct ModelShape {
  int64_t sq, sk;
  bool causal;
  int left, right;
  float softcap;
  bool sinks;
};

// Sliding windows, softcap and sinks (issue 19) against the reference: windows on both sides
// and one, wider and narrower than a key tile (the narrow ones take the precise path), causal
// and not, Sq != Sk both ways (rows left with no key), GQA, strided views, each head dim (d = 64
// from 4097 rows on: the tall tiles).
void run_model_matrix(DType dtype, int head_dim) {
  REQUIRE_HOPPER();
  const ModelShape shapes[] = {
      {1000, 1000, true, 256, -1, 0, false},  {4097, 4097, true, 300, 0, 0, true},
      {1000, 1000, false, 100, 50, 0, false}, {1000, 4097, false, -1, 64, 0, true},
      {4097, 1000, true, 500, 0, 30, false},  {300, 300, false, 0, 0, 0, false},
      {17, 300, false, 1000, 5, 0, true},     {1000, 1000, false, -1, -1, 30, true},
      {1000, 1000, true, -1, -1, 50, true},   {129, 1000, false, 200, -1, 0, false},
  };
  for (const ModelShape& s : shapes)
    for (int64_t hkv : {8, 2}) {
      Case c;
      c.dtype = dtype, c.head_dim = head_dim, c.causal = s.causal;
      c.seqlen_q = s.sq, c.seqlen_k = s.sk, c.batch = 2, c.heads_q = 8, c.heads_kv = hkv;
      c.padded = hkv == 2;
      c.window_left = s.left, c.window_right = s.right, c.softcap = s.softcap, c.sinks = s.sinks;
      check_case(c);
    }
}

}  // namespace

TEST(forward_bf16_d64_full) { run_matrix(DType::bf16, 64, false); }
TEST(forward_bf16_d64_causal) { run_matrix(DType::bf16, 64, true); }
TEST(forward_bf16_d128_full) { run_matrix(DType::bf16, 128, false); }
TEST(forward_bf16_d128_causal) { run_matrix(DType::bf16, 128, true); }
TEST(forward_bf16_d256_full) { run_matrix(DType::bf16, 256, false); }
TEST(forward_bf16_d256_causal) { run_matrix(DType::bf16, 256, true); }
TEST(forward_f16_d64_full) { run_matrix(DType::f16, 64, false); }
TEST(forward_f16_d64_causal) { run_matrix(DType::f16, 64, true); }
TEST(forward_f16_d128_full) { run_matrix(DType::f16, 128, false); }
TEST(forward_f16_d128_causal) { run_matrix(DType::f16, 128, true); }
TEST(forward_f16_d256_full) { run_matrix(DType::f16, 256, false); }
TEST(forward_f16_d256_causal) { run_matrix(DType::f16, 256, true); }
// Head dim 512 (issue 19; split_head_dim.cuh: both consumer warpgroups on the same 64 rows, each
// with half of the head dim, their partial scores summed through shared memory).
TEST(forward_bf16_d512_full) { run_matrix(DType::bf16, 512, false); }
TEST(forward_bf16_d512_causal) { run_matrix(DType::bf16, 512, true); }
TEST(forward_f16_d512_full) { run_matrix(DType::f16, 512, false); }
TEST(forward_f16_d512_causal) { run_matrix(DType::f16, 512, true); }

// ---- beyond the matrix

TEST(forward_without_lse_and_custom_scale) {
  REQUIRE_HOPPER();
  Case c;
  c.with_lse = false;
  c.seqlen_q = 300, c.seqlen_k = 777, c.heads_kv = 4;
  check_case(c);
  c.dtype = DType::f16, c.head_dim = 64, c.causal = true;
  c.softmax_scale = 0.3f;
  check_case(c);
  c.dtype = DType::bf16, c.head_dim = 256, c.causal = false;
  c.softmax_scale = 0.01f;
  check_case(c);
}

// Row maxima that jump by more than fp32's range when the last key tile visited (the first)
// comes: every head dim, causal and not, with partial tiles and GQA.
TEST(forward_score_jump) {
  REQUIRE_HOPPER();
  for (int d : {64, 128, 256})
    for (bool causal : {false, true})
      for (DType dtype : {DType::bf16, DType::f16}) {
        Case c;
        c.dtype = dtype, c.head_dim = d, c.causal = causal, c.score_jump = true;
        c.seqlen_q = c.seqlen_k = dtype == DType::bf16 ? 1000 : 300;
        c.heads_q = 4, c.heads_kv = 2;
        check_case(c);
      }
}

// The split tail (hopper/split_tail.hpp): shapes whose last wave is cut into key ranges over
// all 132 CTAs, each tile over ~10 of them (2200 keys: 13-20 key tiles, ranges of 2-3), GQA
// and strided tensors among them. With one chunk of heads the tail tiles are the query blocks
// 0 and 1 (tile_order.hpp): their rows are all checked. The 16385-key shapes of the matrix and
// the 64K test split with 2-3 CTAs per tile.
TEST(forward_split_tail_shapes) {
  REQUIRE_HOPPER();
  for (DType dtype : {DType::bf16, DType::f16})
    for (int d : {64, 128, 256}) {
      Case c;
      c.dtype = dtype, c.head_dim = d;
      c.seqlen_q = c.seqlen_k = 2200;
      c.heads_q = d == 64 ? 12 : 8;  // 144 tiles of 192 (d = 64) or 128 rows
      c.heads_kv = dtype == DType::bf16 ? c.heads_q : 2;
      c.padded = dtype == DType::f16;
      c.first_rows = 384;
      check_case(c);
    }
}

// Head dims between and below the kernels' (any multiple of 8 from 8 to 256): each runs in the
// d = 64, 128 or 256 kernel with the missing columns zero-filled by TMA, and out written only
// in its real columns (strided cases: the head stride is d + 64, so a write of a padded column
// lands in the gap, where written_outside_view sees it). The reference takes the real head
// dim, so a default scale of 1/sqrt(padded d) would fail. Every d from each kernel's range,
// its smallest and largest among them; causal and not, Sq != Sk both ways (rows with no key:
// causal 1000 x 77), GQA and MHA, f16 in some. Seqlens stay small: the fp64 reference is the
// cost.
TEST(forward_padded_head_dims) {
  REQUIRE_HOPPER();
  struct Shape {
    int64_t sq, sk;
    bool causal;
    int64_t heads_kv;
    bool padded;
    DType dtype;
  };
  const Shape shapes[] = {
      {77, 77, false, 8, false, DType::bf16},    {513, 1000, true, 2, true, DType::bf16},
      {1000, 513, false, 2, false, DType::bf16}, {1, 77, true, 8, true, DType::f16},
      {1000, 77, true, 2, false, DType::f16},    {300, 300, false, 8, true, DType::f16},
  };
  // (264 .. 504: the 512 kernel, whose warpgroups each hold half of the head dim: 264 leaves the
  // second 8 real columns of its 256)
  for (int d : {8, 32, 40, 72, 80, 96, 112, 136, 160, 192, 200, 248, 264, 320, 384, 488, 504})
    for (const Shape& s : shapes) {
      Case c;
      c.dtype = s.dtype, c.head_dim = d, c.causal = s.causal;
      c.seqlen_q = s.sq, c.seqlen_k = s.sk, c.batch = 2, c.heads_q = 8, c.heads_kv = s.heads_kv;
      c.padded = s.padded;
      c.nan_outside_inputs = true;
      check_case(c);
    }
  // No lse, an explicit scale (it replaces 1/sqrt(d), padded or not).
  Case c;
  c.head_dim = 80, c.with_lse = false, c.softmax_scale = 0.3f, c.seqlen_q = 200, c.seqlen_k = 333;
  c.heads_kv = 2, c.nan_outside_inputs = true;
  check_case(c);
  // Row maxima that jump past fp32's range (9 sqrt(d) nats: 127 at d = 200, 142 at 248).
  for (int d : {200, 248}) {
    Case j;
    j.dtype = d == 200 ? DType::f16 : DType::bf16, j.head_dim = d, j.score_jump = true;
    j.seqlen_q = j.seqlen_k = 300, j.heads_q = 4, j.heads_kv = 2;
    check_case(j);
  }
}

// The window, softcap and sinks (issue 19) at padded head dims, one in each kernel's range:
// the options act on the scores, which the zero columns must leave as the real dims make them.
TEST(forward_padded_head_dims_window_softcap_sinks) {
  REQUIRE_HOPPER();
  const ModelShape shapes[] = {
      {1000, 1000, true, 256, -1, 0, false}, {1000, 1000, false, -1, -1, 30, true},
      {129, 1000, false, 200, -1, 0, true},  {513, 1000, false, 100, 50, 30, true},
      {1000, 513, true, 300, 0, 50, false},
  };
  for (int d : {40, 80, 200})
    for (const ModelShape& s : shapes) {
      Case c;
      c.dtype = d == 80 ? DType::f16 : DType::bf16, c.head_dim = d, c.causal = s.causal;
      c.seqlen_q = s.sq, c.seqlen_k = s.sk, c.batch = 2, c.heads_q = 8, c.heads_kv = 2, c.padded = d != 40;
      c.window_left = s.left, c.window_right = s.right, c.softcap = s.softcap, c.sinks = s.sinks;
      c.nan_outside_inputs = true;
      check_case(c);
    }
}

// A race shows as results that move between runs on the same inputs.
// Every main-loop shape runs here, so that the sanitizers (scripts/gpu_run.sh, stage sanitize)
// see them all: d = 64 with 3000 rows takes the tall tiles (three consumer warpgroups), d = 128
// and 256 the rows-then-convert softmax (ForwardConfig::kSoftmaxRowsThenConvert), at two
// sizes of P·V. 40 and 200 run the d = 64 and 256 kernels padded, so that the sanitizers see
// their zero-filled loads and narrowed stores too.
TEST(forward_is_deterministic) {
  REQUIRE_HOPPER();
  for (int d : {64, 128, 256, 40, 200})
    for (bool causal : {false, true}) {
      DeviceTensor q(DType::bf16, 2, 3000, 4, d, false), k(DType::bf16, 2, 3000, 2, d, false),
          v(DType::bf16, 2, 3000, 2, d, false), o(DType::bf16, 2, 3000, 4, d, false);
      const uint64_t seed = gpu_test::fresh_seed();
      q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2);
      std::vector<uint16_t> first;
      for (int run = 0; run < 3; ++run) {
        o.poison();
        warpattn::ForwardOptions opt;
        opt.causal = causal;
        warpattn::forward(q.view, k.view, v.view, o.view, std::nullopt, opt, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        auto r = o.raw();
        if (run == 0) first = r;
        else CHECK(r == first) << "run " << run << " differs from run 0 (d " << d << ", causal " << causal << ")";
      }
    }
}

// The stream argument is honoured: work queued on a busy stream runs after what precedes it.
TEST(forward_runs_on_the_given_stream) {
  REQUIRE_HOPPER();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceTensor q(DType::bf16, 1, 2048, 4, 64, false), k(DType::bf16, 1, 2048, 4, 64, false),
      v(DType::bf16, 1, 2048, 4, 64, false), o(DType::bf16, 1, 2048, 4, 64, false),
      ref(DType::bf16, 1, 2048, 4, 64, false);
  const uint64_t seed = gpu_test::fresh_seed();
  q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2);
  warpattn::forward(q.view, k.view, v.view, ref.view, std::nullopt, {}, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  o.poison();
  CUDA_OK(cudaDeviceSynchronize());
  // Refill v on the stream, then attend on it: the result must use the new v.
  gpu_test::fill_normal_kernel<<<1024, 256, 0, stream>>>(v.mem, 1, 2048, 4, 64, v.view.stride[0],
                                                         v.view.stride[1], v.view.stride[2], seed + 7, true);
  warpattn::forward(q.view, k.view, v.view, o.view, std::nullopt, {}, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  DeviceTensor again(DType::bf16, 1, 2048, 4, 64, false);
  warpattn::forward(q.view, k.view, v.view, again.view, std::nullopt, {}, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto on_stream = o.logical(o.raw()), on_default = again.logical(again.raw());
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < on_stream.size(); ++i)
    if (on_stream[i] != on_default[i]) differ++, first = first < 0 ? int64_t(i) : first;
  CHECK(differ == 0) << "result on the stream differs from the same call on the default stream in "
                     << differ << " elements, first at " << first;
  CHECK(on_stream != ref.logical(ref.raw())) << "v was refilled on the stream, yet the output did not change";
  cudaStreamDestroy(stream);
}

// seqlen_k == 0: every row has no key: O = 0, LSE = -inf. An empty batch writes nothing.
TEST(forward_zero_length_keys_and_empty_batch) {
  REQUIRE_HOPPER();
  DeviceTensor q(DType::f16, 2, 33, 4, 128, true), k(DType::f16, 2, 0, 2, 128, false),
      v(DType::f16, 2, 0, 2, 128, false), o(DType::f16, 2, 33, 4, 128, true);
  q.fill_normal(1);
  o.poison();
  float* lse_mem;
  CUDA_OK(cudaMalloc(&lse_mem, 2 * 4 * 33 * 4));
  CUDA_OK(cudaMemset(lse_mem, 0, 2 * 4 * 33 * 4));
  const int64_t lse_shape[3] = {2, 4, 33};
  const auto lse = warpattn::make_contiguous_view(lse_mem, DType::f32, 3, lse_shape);
  warpattn::forward(q.view, k.view, v.view, o.view, lse, {}, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto raw = o.raw();
  CHECK(o.written_outside_view(raw) == 0);
  const auto vals = o.logical(raw);
  CHECK(std::all_of(vals.begin(), vals.end(), [](float x) { return x == 0.f; })) << "O rows must be zero";
  std::vector<float> l(2 * 4 * 33);
  CUDA_OK(cudaMemcpy(l.data(), lse_mem, l.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(std::all_of(l.begin(), l.end(), [](float x) { return std::isinf(x) && x < 0; })) << "LSE must be -inf";
  cudaFree(lse_mem);

  DeviceTensor q0(DType::f16, 0, 33, 4, 128, false), k0(DType::f16, 0, 40, 2, 128, false),
      v0(DType::f16, 0, 40, 2, 128, false), o0(DType::f16, 0, 33, 4, 128, false);
  o0.poison();
  warpattn::forward(q0.view, k0.view, v0.view, o0.view, std::nullopt, {}, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto raw0 = o0.raw();
  CHECK(std::all_of(raw0.begin(), raw0.end(), [](uint16_t x) { return x == 0xFFFF; }));
}

// 64K tokens against the fp64 reference, elementwise, with a bound from the error model:
// the kernel rounds each P entry to BF16 for the P·V GEMM and the result to BF16. BF16 keeps 8
// significant bits, so rounding moves a value by up to half a unit of its 8th bit: a relative
// error uniform in +-2^-8 at the bottom of a binade (+-2^-9 at the top), standard deviation at
// most 2^-8 / sqrt(3), independent across keys. So element d of a row may be off by one BF16 ulp
// of its value (the output's rounding, half an ulp, with room for the rest) plus 6 standard
// deviations of the P rounding: 6 x 2^-8 / sqrt(3) x its spread
// (reference::attention_row_with_spread). At 64K keys the spread is ~6e-3 and the bound ~2e-4
// for an element near 0.02, ~9e-5 near 0 (runs 10-77 measured at most 9e-5; run 77's first
// bound, with 2^-9, was met with 6e-6 to spare: too close). For rows with a few keys (the first
// causal rows) the same formula covers the worst case of the rounding, 2^-8 x sum P_j |v_j|, up
// to 12 keys. The bound must also catch what it exists for: the same check run against a
// reference with a planted fault (the last key tile dropped, the softmax scale 1% off) must fail.
struct Bound64k {
  double max_delta = 0, max_excess = -INFINITY;
  void add(double got, double want, double spread) {
    const double delta = std::isnan(got) ? INFINITY : std::fabs(got - want);
    const double ulp = want == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(want) - 7);
    max_delta = gpu_test::worse(max_delta, delta);
    max_excess = std::max(max_excess, std::isnan(got) ? INFINITY : delta - (ulp + 6 * 0x1p-8 / std::sqrt(3.0) * spread));
  }
};

void check_64k(bool causal) {
  REQUIRE_HOPPER();
  const int64_t S = 65536, H = 2, D = 128;
  DeviceTensor q(DType::bf16, 1, S, H, D, false), k(DType::bf16, 1, S, H, D, false),
      v(DType::bf16, 1, S, H, D, false), o(DType::bf16, 1, S, H, D, false);
  const uint64_t seed = gpu_test::fresh_seed();
  q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2);
  o.poison();
  warpattn::ForwardOptions opt;
  opt.causal = causal;
  warpattn::forward(q.view, k.view, v.view, o.view, std::nullopt, opt, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = o.logical(o.raw());
  const auto qf = q.logical(q.raw()), kf = k.logical(k.raw()), vf = v.logical(v.raw());
  const warpattn::reference::AttentionShape shape{1, S, S, H, H, D, 1.0 / std::sqrt(double(D)), causal};
  // The faults: the last key tile of 128 left out (non-causal only: with causal, seqlen_k < S
  // would move the diagonal), and a softmax scale 1% too large.
  std::vector<warpattn::reference::AttentionShape> faults;
  if (!causal) faults.push_back({1, S, S - 128, H, H, D, shape.softmax_scale, false});
  faults.push_back({1, S, S, H, H, D, shape.softmax_scale * 1.01, causal});
  std::mt19937_64 rng(seed);
  // The first rows, the rows around the precise path's limit (kPreciseKeyLimit = 128: the
  // query block from row 128 on sees >= 129 keys and takes the fast path, the block before it
  // the precise one), the last, and random ones.
  std::vector<int64_t> rows = {0, 1, 2, 100, 126, 127, 128, 129, 160, 191, 192, 255, 256, S - 1};
  for (int i = 0; i < 40; ++i) rows.push_back(static_cast<int64_t>(rng() % S));
  const int64_t checks = static_cast<int64_t>(rows.size()) * H;
  std::vector<Bound64k> per_check(checks), per_fault(checks * faults.size());
  parallel_for(checks, [&](int64_t i) {
    const int64_t row = rows[i / H], h = i % H;
    std::vector<double> want(D), spread(D), faulty(D);
    warpattn::reference::attention_row_with_spread(shape, qf.data(), kf.data(), vf.data(), 0, h, row, want.data(),
                                                   nullptr, spread.data());
    for (int64_t d = 0; d < D; ++d) per_check[i].add(got[(row * H + h) * D + d], want[d], spread[d]);
    for (size_t f = 0; f < faults.size(); ++f) {
      warpattn::reference::attention_row(faults[f], qf.data(), kf.data(), vf.data(), 0, h, row, faulty.data(), nullptr);
      for (int64_t d = 0; d < D; ++d) per_fault[f * checks + i].add(got[(row * H + h) * D + d], faulty[d], spread[d]);
    }
  });
  Bound64k all;
  for (const Bound64k& b : per_check) all.max_delta = std::max(all.max_delta, b.max_delta), all.max_excess = std::max(all.max_excess, b.max_excess);
  printf("    64K %s: max |delta| %.3e over %zu rows x %lld heads (bound 1 ulp + 6 sigma of P's rounding; "
         "worst margin %.3e; seed %llu)\n",
         causal ? "causal" : "full", all.max_delta, rows.size(), (long long)H, -all.max_excess, (unsigned long long)seed);
  CHECK(all.max_excess <= 0) << "max |delta| " << all.max_delta << " exceeds the bound by " << all.max_excess << " seed "
                             << seed;
  for (size_t f = 0; f < faults.size(); ++f) {
    double excess = -INFINITY;
    for (int64_t i = 0; i < checks; ++i) excess = std::max(excess, per_fault[f * checks + i].max_excess);
    const char* what = faults[f].seqlen_k < S ? "last key tile dropped" : "softmax scale x 1.01";
    printf("    64K %s, planted fault (%s): exceeds the bound by %.3e\n", causal ? "causal" : "full", what, excess);
    CHECK(excess > 0) << "the 64K bound does not catch a planted fault: " << what;
  }
}
TEST(forward_64k_tokens_full) { check_64k(false); }
TEST(forward_64k_tokens_causal) { check_64k(true); }

TEST(forward_window_softcap_sinks_bf16_d64) { run_model_matrix(DType::bf16, 64); }
TEST(forward_window_softcap_sinks_bf16_d128) { run_model_matrix(DType::bf16, 128); }
TEST(forward_window_softcap_sinks_bf16_d256) { run_model_matrix(DType::bf16, 256); }
TEST(forward_window_softcap_sinks_f16_d128) { run_model_matrix(DType::f16, 128); }
TEST(forward_window_softcap_sinks_bf16_d512) { run_model_matrix(DType::bf16, 512); }

// The features change what the kernel computes: the same comparison against a reference with
// a planted mistake (a window one key narrower on the left, the sinks left out) must fail, so
// the matrix above can.
TEST(forward_window_and_sinks_planted_faults_fail) {
  REQUIRE_HOPPER();
  Case c;
  c.seqlen_q = c.seqlen_k = 1000, c.window_left = 100, c.window_right = 20, c.sinks = true;
  c.sink_mean = 4;  // exp(sink) ~ 55 against a denominator ~ 200: some head's LSE moves by > 0.01
  const uint64_t seed = gpu_test::fresh_seed();
  const Outcome right = run_case(c, seed);
  CHECK(right.rel_l2 <= tolerance(c.dtype)) << right.rel_l2 << " seed " << seed;
  c.fault_narrower_window = true;
  const Outcome narrower = run_case(c, seed);
  CHECK(narrower.rel_l2 > 3 * tolerance(c.dtype)) << narrower.rel_l2 << " seed " << seed;
  c.fault_narrower_window = false, c.fault_no_sinks = true;
  const Outcome no_sinks = run_case(c, seed);
  CHECK(no_sinks.rel_l2 > 3 * tolerance(c.dtype) || no_sinks.lse_max_err > 1e-2)
      << no_sinks.rel_l2 << " " << no_sinks.lse_max_err << " seed " << seed;
}

HARNESS_MAIN()
