// GPU tests of warpattn::forward_varlen (packed variable-length batches): every sequence
// against the fp64 reference on that sequence alone, and against warpattn::forward run on that
// sequence (bitwise where the two launches' tiles are the same: causal, or few tiles, at head
// dims whose dense kernel takes the same tile shape); outputs poisoned (NaN) before each run,
// nothing written outside the views. Skips with the reason where no sm_90 GPU exists.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>

#include "gpu_test_support.cuh"
#include "reference/reference.hpp"

using gpu_test::DeviceInts;
using gpu_test::DeviceTensor;
using gpu_test::parallel_for;
using warpattn::DType;

namespace {

// The (total, heads, head_dim) view of a (1, total, heads, head_dim) tensor.
warpattn::TensorView packed(const warpattn::TensorView& t) {
  warpattn::TensorView v = t;
  v.rank = 3;
  for (int i = 0; i < 3; ++i) v.shape[i] = t.shape[i + 1], v.stride[i] = t.stride[i + 1];
  return v;
}

// Rows [offset, offset + length) of a (1, total, heads, head_dim) tensor as a (1, length, ...)
// tensor.
warpattn::TensorView rows_of(const warpattn::TensorView& t, int64_t offset, int64_t length) {
  warpattn::TensorView v = t;
  v.data = static_cast<uint16_t*>(t.data) + offset * t.stride[1];
  v.shape[1] = length;
  return v;
}

struct Batch {
  DType dtype = DType::bf16;
  int head_dim = 128;
  bool causal = false;
  int64_t heads_q = 8, heads_kv = 2;
  std::vector<int> seqlen_q, seqlen_k;  // per sequence
  std::vector<int> seqused_k;           // empty: none
  bool padded = false;                  // strided packed views
  int64_t spare_q_rows = 0;             // rows of q past the last sequence (never written)
};

std::string describe(const Batch& c) {
  char buf[200];
  int64_t tq = 0, tk = 0;
  for (size_t b = 0; b < c.seqlen_q.size(); ++b) tq += c.seqlen_q[b], tk += c.seqlen_k[b];
  snprintf(buf, sizeof buf, "%s d=%d %s B=%zu total %lld/%lld Hq=%lld Hkv=%lld%s%s", c.dtype == DType::bf16 ? "bf16" : "fp16",
           c.head_dim, c.causal ? "causal" : "full", c.seqlen_q.size(), (long long)tq, (long long)tk,
           (long long)c.heads_q, (long long)c.heads_kv, c.padded ? " strided" : "", c.seqused_k.empty() ? "" : " seqused_k");
  return buf;
}

std::vector<int> offsets(const std::vector<int>& lengths) {
  std::vector<int> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];
  return cu;
}

// Runs forward_varlen on the batch and checks every sequence as described at the top.
void check_batch(const Batch& c) {
  const uint64_t seed = gpu_test::fresh_seed();
  const std::vector<int> cu_q = offsets(c.seqlen_q), cu_k = offsets(c.seqlen_k);
  const int B = static_cast<int>(c.seqlen_q.size());
  const int64_t total_q = cu_q[B] + c.spare_q_rows, total_k = cu_k[B], H = c.heads_q, D = c.head_dim;
  DeviceTensor q(c.dtype, 1, total_q, c.heads_q, D, c.padded), k(c.dtype, 1, total_k, c.heads_kv, D, c.padded),
      v(c.dtype, 1, total_k, c.heads_kv, D, c.padded), out(c.dtype, 1, total_q, c.heads_q, D, c.padded),
      dense_out(c.dtype, 1, total_q, c.heads_q, D, c.padded);
  q.fill_normal(seed);
  k.fill_normal(seed + 1);
  v.fill_normal(seed + 2);
  out.poison();
  dense_out.poison();
  // lse (Hq, total_q), and the dense runs' lse per sequence in the same layout.
  float *lse = nullptr, *dense_lse = nullptr;
  const size_t lse_elems = static_cast<size_t>(H * total_q) + 8;
  CUDA_OK(cudaMalloc(&lse, lse_elems * 4));
  CUDA_OK(cudaMalloc(&dense_lse, lse_elems * 4));
  cudaMemset(lse, 0xFF, lse_elems * 4);
  cudaMemset(dense_lse, 0xFF, lse_elems * 4);
  warpattn::TensorView lse_view;
  lse_view.data = lse, lse_view.dtype = DType::f32, lse_view.rank = 2;
  lse_view.shape[0] = H, lse_view.shape[1] = total_q, lse_view.stride[0] = total_q, lse_view.stride[1] = 1;

  DeviceInts dcu_q(cu_q), dcu_k(cu_k), dused(c.seqused_k.empty() ? std::vector<int>{0} : c.seqused_k);
  warpattn::VarlenBatch batch;
  batch.cu_seqlens_q = dcu_q.view;
  batch.cu_seqlens_k = dcu_k.view;
  if (!c.seqused_k.empty()) batch.seqused_k = dused.view;
  batch.max_seqlen_q = *std::max_element(c.seqlen_q.begin(), c.seqlen_q.end());
  batch.max_seqlen_k = *std::max_element(c.seqlen_k.begin(), c.seqlen_k.end());
  warpattn::ForwardOptions options;
  options.causal = c.causal;
  CUDA_OK(cudaDeviceSynchronize());
  warpattn::forward_varlen(packed(q.view), packed(k.view), packed(v.view), packed(out.view), lse_view, batch, options);
  CUDA_OK(cudaDeviceSynchronize());

  // The dense kernel on each sequence alone (the keys it uses: seqused_k's when given).
  for (int b = 0; b < B; ++b) {
    const int used_k = c.seqused_k.empty() ? c.seqlen_k[b] : c.seqused_k[b];
    if (c.seqlen_q[b] == 0) continue;
    warpattn::TensorView l = lse_view;
    l.data = dense_lse + cu_q[b];
    l.rank = 3;
    l.shape[0] = 1, l.shape[1] = H, l.shape[2] = c.seqlen_q[b];
    l.stride[0] = H * total_q, l.stride[1] = total_q, l.stride[2] = 1;
    warpattn::forward(rows_of(q.view, cu_q[b], c.seqlen_q[b]), rows_of(k.view, cu_k[b], used_k),
                      rows_of(v.view, cu_k[b], used_k), rows_of(dense_out.view, cu_q[b], c.seqlen_q[b]), l, options);
  }
  CUDA_OK(cudaDeviceSynchronize());

  const auto out_raw = out.raw(), dense_raw = dense_out.raw();
  const auto got = out.logical(out_raw), dense = dense_out.logical(dense_raw);
  std::vector<float> lse_host(lse_elems), dense_lse_host(lse_elems);
  cudaMemcpy(lse_host.data(), lse, lse_elems * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(dense_lse_host.data(), dense_lse, lse_elems * 4, cudaMemcpyDeviceToHost);
  cudaFree(lse);
  cudaFree(dense_lse);
  const auto qf = q.logical(q.raw()), kf = k.logical(k.raw()), vf = v.logical(v.raw());

  // Rows checked against the reference: every row of short sequences, else the first and last
  // few and random ones; all against the dense run.
  std::mt19937_64 rng(seed);
  struct Row {
    int b;
    int64_t row, h;
  };
  std::vector<Row> rows;
  for (int b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int n = c.seqlen_q[b];
      if (int64_t(n) * c.seqlen_k[b] <= 200000) {
        for (int r = 0; r < n; ++r) rows.push_back({b, r, h});
      } else {
        for (int r : {0, 1, 2, n - 2, n - 1}) rows.push_back({b, r, h});
        for (int i = 0; i < 12; ++i) rows.push_back({b, static_cast<int64_t>(rng() % n), h});
      }
    }
  std::vector<double> want(rows.size() * D), want_lse(rows.size());
  parallel_for(static_cast<int64_t>(rows.size()), [&](int64_t i) {
    const Row& r = rows[i];
    const int used_k = c.seqused_k.empty() ? c.seqlen_k[r.b] : c.seqused_k[r.b];
    const warpattn::reference::AttentionShape shape{1, c.seqlen_q[r.b], used_k, c.heads_q, c.heads_kv, D,
                                                    1.0 / std::sqrt(double(D)), c.causal};
    warpattn::reference::attention_row(shape, qf.data() + int64_t(cu_q[r.b]) * H * D,
                                       kf.data() + int64_t(cu_k[r.b]) * c.heads_kv * D,
                                       vf.data() + int64_t(cu_k[r.b]) * c.heads_kv * D, 0, r.h, r.row, &want[i * D],
                                       &want_lse[i]);
  });
  std::vector<float> got_rows(rows.size() * D);
  double lse_err = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t row = cu_q[rows[i].b] + rows[i].row;
    std::copy_n(&got[(row * H + rows[i].h) * D], D, &got_rows[i * D]);
    const double g = lse_host[rows[i].h * total_q + row], w = want_lse[i];
    lse_err = gpu_test::worse(lse_err, std::isinf(w) ? (g == w ? 0.0 : INFINITY) : std::fabs(g - w));
  }
  const auto stats = warpattn::reference::compare(got_rows.data(), want.data(), static_cast<int64_t>(want.size()));
  // Against the dense run, every covered row: bitwise where the tiles coincide, else close.
  int64_t differ = 0, lse_differ = 0;
  double dense_max = 0;
  for (int b = 0; b < B; ++b)
    for (int64_t r = cu_q[b]; r < cu_q[b + 1]; ++r)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const int64_t e = (r * H + h) * D + d;
          differ += memcmp(&got[e], &dense[e], 4) != 0;
          dense_max = gpu_test::worse(dense_max, std::fabs(double(got[e]) - dense[e]));
        }
        lse_differ += memcmp(&lse_host[h * total_q + r], &dense_lse_host[h * total_q + r], 4) != 0;
      }
  // Rows no sequence covers (spare_q_rows) and every element outside the views keep the poison.
  int64_t uncovered_written = 0;
  for (int64_t r = cu_q[B]; r < total_q; ++r)
    for (int64_t h = 0; h < H; ++h) {
      uint32_t bits;
      memcpy(&bits, &lse_host[h * total_q + r], 4);
      uncovered_written += bits != 0xFFFFFFFFu;
      for (int64_t d = 0; d < D; ++d) uncovered_written += !std::isnan(got[(r * H + h) * D + d]);
    }
  const int64_t outside = out.written_outside_view(out_raw);
  // Bitwise only where the dense launch takes the same tiles: the same height and no split tail (a non-causal dense launch with more tiles than the H200's 132 SMs
  // may split its last wave's key ranges).
  // The packed launch takes the tall tiles at d = 64 always, the dense one when its own sequence
  // reaches 2048 rows; head dims below 64 run padded in the same kernels, so they do too.
  bool same_tiles = true;
  for (int b = 0; b < B; ++b) {
    same_tiles = same_tiles && !(D <= 64 && c.seqlen_q[b] < 2048);
    same_tiles = same_tiles && (c.causal || int64_t(c.seqlen_q[b] + 127) / 128 * H <= 132);
  }
  const double tol = c.dtype == DType::bf16 ? 5e-3 : 1e-3;
  const bool ok = stats.nan_count == 0 && stats.rel_l2 <= tol && lse_err <= 1e-4 && outside == 0 &&
                  uncovered_written == 0 && (!same_tiles || (differ == 0 && lse_differ == 0)) && dense_max <= 0.05;
  printf("    %-66s rows %6zu  relL2 %.2e  lse %.1e  vs dense: %lld differ (max %.1e)%s  %s\n", describe(c).c_str(),
         rows.size(), stats.rel_l2, lse_err, (long long)differ, dense_max, same_tiles ? " [bitwise]" : "",
         ok ? "ok" : "FAIL");
  CHECK(stats.nan_count == 0) << describe(c) << " NaN in output: " << stats.nan_count << " seed " << seed;
  CHECK(stats.rel_l2 <= tol) << describe(c) << " rel L2 " << stats.rel_l2 << " seed " << seed;
  CHECK(lse_err <= 1e-4) << describe(c) << " LSE error " << lse_err << " seed " << seed;
  CHECK(outside == 0) << describe(c) << " wrote " << outside << " elements outside out";
  CHECK(uncovered_written == 0) << describe(c) << " wrote " << uncovered_written << " values in rows of no sequence";
  CHECK(dense_max <= 0.05) << describe(c) << " differs from the dense kernel by " << dense_max << " seed " << seed;
  if (same_tiles) {
    CHECK(differ == 0) << describe(c) << " " << differ << " elements differ from the dense kernel's bits, seed " << seed;
    CHECK(lse_differ == 0) << describe(c) << " " << lse_differ << " lse values differ from the dense kernel's";
  }
}

// A ragged batch of the edge lengths (0, 1, odd, a block and one more, long), query and key
// lengths drawn independently (Sq != Sk per sequence).
Batch ragged(DType dtype, int head_dim, bool causal, uint64_t seed) {
  Batch c;
  c.dtype = dtype, c.head_dim = head_dim, c.causal = causal;
  std::mt19937_64 rng(seed);
  const int lengths[] = {0, 1, 17, 128, 129, 383, 1000, 2500};
  for (int i = 0; i < 9; ++i) {
    c.seqlen_q.push_back(lengths[rng() % 8]);
    c.seqlen_k.push_back(i == 3 ? 0 : lengths[rng() % 8]);  // one sequence without keys at least
  }
  c.seqlen_q[0] = 1000, c.seqlen_k[0] = 1000;  // one equal-length sequence
  return c;
}

void run_matrix(DType dtype, int head_dim) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Batch c = ragged(dtype, head_dim, causal, gpu_test::fresh_seed());
    c.padded = head_dim == 128;  // strided packed views at one head dim
    check_batch(c);
  }
}


// ---- backward_varlen: against warpattn::backward run on each sequence alone with the same
// out and lse (bitwise in the deterministic mode: the same tiles add in the same order; within
// a few ULP otherwise, where dQ's pieces land in any order), gradients poisoned before, nothing
// written outside the views.
void check_backward(const Batch& c, bool deterministic) {
  const uint64_t seed = gpu_test::fresh_seed();
  const std::vector<int> cu_q = offsets(c.seqlen_q), cu_k = offsets(c.seqlen_k);
  const int B = static_cast<int>(c.seqlen_q.size());
  const int64_t total_q = cu_q[B], total_k = cu_k[B], H = c.heads_q, D = c.head_dim;
  DeviceTensor q(c.dtype, 1, total_q, H, D, c.padded), k(c.dtype, 1, total_k, c.heads_kv, D, c.padded),
      v(c.dtype, 1, total_k, c.heads_kv, D, c.padded), dout(c.dtype, 1, total_q, H, D, c.padded),
      out(c.dtype, 1, total_q, H, D, false), dq(c.dtype, 1, total_q, H, D, c.padded),
      dk(c.dtype, 1, total_k, c.heads_kv, D, c.padded), dv(c.dtype, 1, total_k, c.heads_kv, D, c.padded),
      dq2(c.dtype, 1, total_q, H, D, c.padded), dk2(c.dtype, 1, total_k, c.heads_kv, D, c.padded),
      dv2(c.dtype, 1, total_k, c.heads_kv, D, c.padded);
  q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2), dout.fill_normal(seed + 3);
  for (DeviceTensor* t : {&dq, &dk, &dv, &dq2, &dk2, &dv2}) t->poison();
  float* lse = nullptr;
  CUDA_OK(cudaMalloc(&lse, std::max<int64_t>(H * total_q, 1) * 4));
  warpattn::TensorView lse_view;
  lse_view.data = lse, lse_view.dtype = DType::f32, lse_view.rank = 2;
  lse_view.shape[0] = H, lse_view.shape[1] = total_q, lse_view.stride[0] = total_q, lse_view.stride[1] = 1;
  DeviceInts dcu_q(cu_q), dcu_k(cu_k);
  warpattn::VarlenBatch batch;
  batch.cu_seqlens_q = dcu_q.view, batch.cu_seqlens_k = dcu_k.view;
  warpattn::ForwardOptions fo;
  fo.causal = c.causal;
  warpattn::forward_varlen(packed(q.view), packed(k.view), packed(v.view), packed(out.view), lse_view, batch, fo);
  warpattn::BackwardOptions bo;
  bo.causal = c.causal, bo.deterministic = deterministic;
  warpattn::backward_varlen(packed(dout.view), packed(q.view), packed(k.view), packed(v.view), packed(out.view),
                            lse_view, packed(dq.view), packed(dk.view), packed(dv.view), batch, bo);
  for (int b = 0; b < B; ++b) {
    warpattn::TensorView l = lse_view;
    l.data = lse + cu_q[b], l.rank = 3;
    l.shape[0] = 1, l.shape[1] = H, l.shape[2] = c.seqlen_q[b];
    l.stride[0] = H * total_q, l.stride[1] = total_q, l.stride[2] = 1;
    const int lq = c.seqlen_q[b], lk = c.seqlen_k[b];
    warpattn::backward(rows_of(dout.view, cu_q[b], lq), rows_of(q.view, cu_q[b], lq), rows_of(k.view, cu_k[b], lk),
                       rows_of(v.view, cu_k[b], lk), rows_of(out.view, cu_q[b], lq), l, rows_of(dq2.view, cu_q[b], lq),
                       rows_of(dk2.view, cu_k[b], lk), rows_of(dv2.view, cu_k[b], lk), bo);
  }
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(lse);
  struct Diff {
    int64_t nan = 0, differ = 0, outside = 0;
    double rel = 0;
  };
  const auto diff = [](const DeviceTensor& got, const DeviceTensor& want) {
    Diff d;
    const auto raw = got.raw();
    d.outside = got.written_outside_view(raw);
    const auto g = got.logical(raw), w = want.logical(want.raw());
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      d.nan += std::isnan(g[i]);
      d.differ += memcmp(&g[i], &w[i], 4) != 0;
      num += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
      den += double(w[i]) * w[i];
    }
    d.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (std::isnan(d.rel)) d.rel = INFINITY;
    return d;
  };
  const Diff ddq = diff(dq, dq2), ddk = diff(dk, dk2), ddv = diff(dv, dv2);
  // Not deterministic: dQ's fp32 sums in another order, rounded to 16 bits (a few ULP).
  const double tol = deterministic ? 0.0 : 2e-3;
  const bool ok = ddq.nan + ddk.nan + ddv.nan == 0 && ddq.outside + ddk.outside + ddv.outside == 0 &&
                  ddq.rel <= tol && ddk.rel <= tol && ddv.rel <= tol &&
                  (!deterministic || ddq.differ + ddk.differ + ddv.differ == 0);
  printf("    backward %-52s %s: vs dense dq %.1e (%lld differ) dk %.1e (%lld) dv %.1e (%lld)  %s\n", describe(c).c_str(),
         deterministic ? "det" : "   ", ddq.rel, (long long)ddq.differ, ddk.rel, (long long)ddk.differ, ddv.rel,
         (long long)ddv.differ, ok ? "ok" : "FAIL");
  CHECK(ddq.nan + ddk.nan + ddv.nan == 0) << describe(c) << " NaN in a gradient, seed " << seed;
  CHECK(ddq.outside + ddk.outside + ddv.outside == 0) << describe(c) << " wrote outside a gradient's view";
  CHECK(ddq.rel <= tol && ddk.rel <= tol && ddv.rel <= tol)
      << describe(c) << " differs from the dense backward: dq " << ddq.rel << " dk " << ddk.rel << " dv " << ddv.rel
      << " seed " << seed;
  if (deterministic)
    CHECK(ddq.differ + ddk.differ + ddv.differ == 0)
        << describe(c) << " deterministic mode not bitwise equal to the dense one: " << ddq.differ << " / "
        << ddk.differ << " / " << ddv.differ << " seed " << seed;
}

void run_backward_matrix(DType dtype, int head_dim) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true})
    for (bool deterministic : {true, false}) {
      Batch c = ragged(dtype, head_dim, causal, gpu_test::fresh_seed());
      c.padded = head_dim == 128;
      check_backward(c, deterministic);
    }
}

}  // namespace

TEST(varlen_backward_bf16_d64) { run_backward_matrix(DType::bf16, 64); }
TEST(varlen_backward_bf16_d128) { run_backward_matrix(DType::bf16, 128); }
TEST(varlen_backward_bf16_d256) { run_backward_matrix(DType::bf16, 256); }
TEST(varlen_backward_f16_d128) { run_backward_matrix(DType::f16, 128); }
// The 512 kernel (two CTAs per plan tile, one per column half): built without a GPU, not yet run.
TEST(varlen_backward_bf16_d512) { run_backward_matrix(DType::bf16, 512); }
TEST(varlen_backward_f16_d512) { run_backward_matrix(DType::f16, 512); }

// Many short sequences, GQA 8:1, and a sequence of queries without keys beside keys without
// queries.
TEST(varlen_backward_shapes) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Batch many;
    many.causal = causal, many.heads_q = 8, many.heads_kv = 1;
    std::mt19937_64 rng(gpu_test::fresh_seed());
    for (int i = 0; i < 200; ++i) many.seqlen_q.push_back(1 + rng() % 70), many.seqlen_k.push_back(1 + rng() % 70);
    check_backward(many, true);
    Batch edges;
    edges.causal = causal;
    edges.seqlen_q = {300, 0, 129, 64};
    edges.seqlen_k = {0, 300, 1, 4097};
    check_backward(edges, true);
    check_backward(edges, false);
  }
}
// Padded head dims, one run in each kernel (40 in d = 64's, 80 in 128's, 200 in 256's, 264 and
// 384 in 512's): the ragged batch against the reference and the dense kernel (the same padded
// kernel, so bitwise where the tiles coincide), strided at one of them.
TEST(varlen_padded_head_dims) {
  REQUIRE_HOPPER();
  for (int d : {40, 80, 200, 264, 384})
    for (bool causal : {false, true}) {
      Batch c = ragged(d == 200 ? DType::f16 : DType::bf16, d, causal, gpu_test::fresh_seed());
      c.padded = d == 80;
      check_batch(c);
    }
}

// The packed backward at the same padded head dims, against the dense backward per sequence
// (bitwise in the deterministic mode).
TEST(varlen_backward_padded_head_dims) {
  REQUIRE_HOPPER();
  for (int d : {40, 80, 200, 264, 384})
    for (bool causal : {false, true})
      for (bool deterministic : {true, false}) {
        Batch c = ragged(d == 200 ? DType::f16 : DType::bf16, d, causal, gpu_test::fresh_seed());
        c.padded = d == 80;
        check_backward(c, deterministic);
      }
}

TEST(varlen_bf16_d64) { run_matrix(DType::bf16, 64); }
TEST(varlen_bf16_d128) { run_matrix(DType::bf16, 128); }
TEST(varlen_bf16_d256) { run_matrix(DType::bf16, 256); }
TEST(varlen_f16_d64) { run_matrix(DType::f16, 64); }
TEST(varlen_f16_d128) { run_matrix(DType::f16, 128); }
TEST(varlen_f16_d256) { run_matrix(DType::f16, 256); }
TEST(varlen_bf16_d512) { run_matrix(DType::bf16, 512); }
TEST(varlen_f16_d512) { run_matrix(DType::f16, 512); }

// GQA 8:1 and MQA, one sequence (the dense case), all-equal lengths, many short sequences.
TEST(varlen_shapes) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Batch one;
    one.causal = causal, one.heads_q = 8, one.heads_kv = 1;
    one.seqlen_q = {3000}, one.seqlen_k = {3000};
    check_batch(one);
    Batch equal;
    equal.causal = causal, equal.head_dim = 64, equal.heads_q = 4, equal.heads_kv = 4;
    equal.seqlen_q.assign(16, 512), equal.seqlen_k.assign(16, 512);
    check_batch(equal);
    Batch many;  // 300 sequences of 1 to 40 tokens: more than a table entry per tile matters
    many.causal = causal, many.heads_q = 4, many.heads_kv = 2;
    std::mt19937_64 rng(gpu_test::fresh_seed());
    for (int i = 0; i < 300; ++i) many.seqlen_q.push_back(1 + rng() % 40), many.seqlen_k.push_back(1 + rng() % 40);
    check_batch(many);
  }
}

// seqused_k (a KV cache filled to different depths) and rows of q past the last sequence.
TEST(varlen_seqused_k_and_spare_rows) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Batch c;
    c.causal = causal;
    c.seqlen_q = {1, 7, 300, 1};
    c.seqlen_k = {2048, 1024, 1024, 512};
    c.seqused_k = {1500, 3, 1024, 0};
    c.spare_q_rows = 5;
    check_batch(c);
  }
}

// One 64K-token sequence among short ones (the long tail's extreme), sampled rows.
TEST(varlen_64k_sequence) {
  REQUIRE_HOPPER();
  Batch c;
  c.causal = true;
  c.heads_q = 4, c.heads_kv = 1;
  c.seqlen_q = {5, 65536, 300};
  c.seqlen_k = {5, 65536, 1};
  check_batch(c);
}

// Offsets that break the rules (decreasing, past the end, a seqused_k past the keys) give
// undefined numbers but never a fault or a write outside out and lse.
TEST(varlen_bad_offsets_stay_inside) {
  REQUIRE_HOPPER();
  const int64_t total = 600, H = 4, D = 128;
  DeviceTensor q(DType::bf16, 1, total, H, D, false), k(DType::bf16, 1, total, H, D, false),
      v(DType::bf16, 1, total, H, D, false), out(DType::bf16, 1, total, H, D, true);
  q.fill_normal(1), k.fill_normal(2), v.fill_normal(3);
  out.poison();
  DeviceInts cu_q({0, 500, 100, 900, -5, 600}), cu_k({0, 700, 50, 40, 2000000000, 600}),
      used({1 << 30, 600, -3, 100, 600});
  warpattn::VarlenBatch batch;
  batch.cu_seqlens_q = cu_q.view, batch.cu_seqlens_k = cu_k.view, batch.seqused_k = used.view;
  for (bool causal : {false, true}) {
    warpattn::ForwardOptions options;
    options.causal = causal;
    warpattn::forward_varlen(packed(q.view), packed(k.view), packed(v.view), packed(out.view), std::nullopt, batch,
                             options);
    CUDA_OK(cudaDeviceSynchronize());
  }
  const int64_t outside = out.written_outside_view(out.raw());
  printf("    bad offsets: no fault, %lld elements written outside out\n", (long long)outside);
  CHECK(outside == 0) << "wrote " << outside << " elements outside out";
}

// ---- FP8 on packed batches: quantize_fp8_varlen's operands equal quantize_fp8's on each
// sequence alone (codes, Vᵀ columns and descales, bitwise: the blocks start at the sequence's
// first row in both), and forward_fp8_varlen equals forward_fp8 on each sequence (bitwise where
// the two launches take the same tiles, as check_batch).
namespace {

void check_fp8_batch(const Batch& c, warpattn::DType qk) {
  using gpu_test::contiguous;
  using gpu_test::DeviceBuffer;
  const uint64_t seed = gpu_test::fresh_seed();
  const std::vector<int> cu_q = offsets(c.seqlen_q), cu_k = offsets(c.seqlen_k);
  const int B = static_cast<int>(c.seqlen_q.size());
  const int64_t total_q = cu_q[B], total_k = cu_k[B], H = c.heads_q, Hkv = c.heads_kv, D = c.head_dim;
  const int64_t rows_q = warpattn::fp8_varlen_rows(total_q, B), rows_k = warpattn::fp8_varlen_rows(total_k, B);
  DeviceTensor q(c.dtype, 1, total_q, H, D, false), k(c.dtype, 1, total_k, Hkv, D, false),
      v(c.dtype, 1, total_k, Hkv, D, false), out(c.dtype, 1, total_q, H, D, false),
      dense_out(c.dtype, 1, total_q, H, D, false);
  q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2);
  out.poison(), dense_out.poison();
  DeviceBuffer fq(total_q * H * D), fk(total_k * Hkv * D), fvt(Hkv * D * rows_k, 0), fqs(H * rows_q / 128 * 4),
      fks(Hkv * rows_k / 128 * 4), fvs(Hkv * rows_k / 128 * 4);
  warpattn::Fp8Operands ops;
  ops.q = contiguous(fq.mem, qk, {total_q, H, D});
  ops.k = contiguous(fk.mem, qk, {total_k, Hkv, D});
  ops.vt = contiguous(fvt.mem, DType::e4m3, {Hkv, D, rows_k});
  ops.q_descale = contiguous(fqs.mem, DType::f32, {H, rows_q / 128});
  ops.k_descale = contiguous(fks.mem, DType::f32, {Hkv, rows_k / 128});
  ops.v_descale = contiguous(fvs.mem, DType::f32, {Hkv, rows_k / 128});
  DeviceInts dcu_q(cu_q), dcu_k(cu_k);
  warpattn::VarlenBatch batch;
  batch.cu_seqlens_q = dcu_q.view, batch.cu_seqlens_k = dcu_k.view;
  batch.max_seqlen_q = *std::max_element(c.seqlen_q.begin(), c.seqlen_q.end());
  warpattn::QuantizeOptions qo;
  qo.seed = seed;
  warpattn::quantize_fp8_varlen(packed(q.view), packed(k.view), packed(v.view), ops, batch, qo);
  warpattn::ForwardOptions fo;
  fo.causal = c.causal;
  warpattn::forward_fp8_varlen(ops, packed(out.view), std::nullopt, batch, fo, nullptr, false);
  CUDA_OK(cudaDeviceSynchronize());
  const auto codes_q = fq.get<uint8_t>(), codes_k = fk.get<uint8_t>(), vt = fvt.get<uint8_t>();
  const auto qs = fqs.get<float>(), ks = fks.get<float>(), vs = fvs.get<float>();
  int64_t operand_differ = 0;
  for (int b = 0; b < B; ++b) {
    const int lq = c.seqlen_q[b], lk = c.seqlen_k[b];
    if (lq == 0 || lk == 0) continue;
    gpu_test::Fp8Buffers dense(1, lq, lk, H, Hkv, D, qk);
    warpattn::quantize_fp8(rows_of(q.view, cu_q[b], lq), rows_of(k.view, cu_k[b], lk), rows_of(v.view, cu_k[b], lk),
                           dense.ops, qo);
    warpattn::forward_fp8(dense.ops, rows_of(dense_out.view, cu_q[b], lq), std::nullopt, fo, nullptr, false);
    CUDA_OK(cudaDeviceSynchronize());
    const auto dq = dense.q.get<uint8_t>(), dk = dense.k.get<uint8_t>(), dvt = dense.vt.get<uint8_t>();
    const auto dqs = dense.qs.get<float>(), dks = dense.ks.get<float>(), dvs = dense.vs.get<float>();
    operand_differ += memcmp(dq.data(), codes_q.data() + int64_t(cu_q[b]) * H * D, size_t(lq) * H * D) != 0;
    operand_differ += memcmp(dk.data(), codes_k.data() + int64_t(cu_k[b]) * Hkv * D, size_t(lk) * Hkv * D) != 0;
    const int64_t q0 = (int64_t(cu_q[b]) + 128 * b) / 128, k0 = (int64_t(cu_k[b]) + 128 * b) / 128;
    const int64_t keys = warpattn::fp8_padded_keys(lk);
    for (int64_t h = 0; h < Hkv; ++h) {
      for (int64_t d = 0; d < D; ++d)
        operand_differ += memcmp(&dvt[(h * D + d) * keys], &vt[(h * D + d) * rows_k + 128 * k0], keys) != 0;
      for (int64_t j = 0; j < (lk + 127) / 128; ++j)
        operand_differ += ks[h * rows_k / 128 + k0 + j] != dks[h * ((lk + 127) / 128) + j] ||
                          vs[h * rows_k / 128 + k0 + j] != dvs[h * ((lk + 127) / 128) + j];
    }
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < (lq + 127) / 128; ++j)
        operand_differ += qs[h * rows_q / 128 + q0 + j] != dqs[h * ((lq + 127) / 128) + j];
  }
  const auto got = out.logical(out.raw()), want = dense_out.logical(dense_out.raw());
  int64_t differ = 0, nan = 0;
  double worst = 0;
  for (int b = 0; b < B; ++b) {
    if (c.seqlen_k[b] == 0) continue;  // (rows without keys: 0 in both, not compared here)
    for (int64_t e = int64_t(cu_q[b]) * H * D; e < int64_t(cu_q[b + 1]) * H * D; ++e) {
      nan += std::isnan(got[e]);
      differ += memcmp(&got[e], &want[e], 4) != 0;
      worst = gpu_test::worse(worst, std::fabs(double(got[e]) - want[e]));
    }
  }
  bool same_tiles = true;
  for (int b = 0; b < B; ++b) {
    same_tiles = same_tiles && !(D == 64 && (c.seqlen_q[b] >= 2048) != (batch.max_seqlen_q >= 2048));
    same_tiles = same_tiles && (c.causal || int64_t(c.seqlen_q[b] + 127) / 128 * H <= 132);
  }
  const bool ok = operand_differ == 0 && nan == 0 && worst <= 0.05 && (!same_tiles || differ == 0);
  printf("    fp8 %-6s %-58s operands differ %lld, out vs dense %lld differ (max %.1e)%s  %s\n",
         qk == DType::s8 ? "int8qk" : "e4m3", describe(c).c_str(), (long long)operand_differ, (long long)differ, worst,
         same_tiles ? " [bitwise]" : "", ok ? "ok" : "FAIL");
  CHECK(operand_differ == 0) << describe(c) << " quantize_fp8_varlen differs from quantize_fp8 per sequence, seed " << seed;
  CHECK(nan == 0) << describe(c) << " NaN in the FP8 output, seed " << seed;
  CHECK(worst <= 0.05) << describe(c) << " FP8 varlen differs from the dense FP8 kernel by " << worst << " seed " << seed;
  if (same_tiles) CHECK(differ == 0) << describe(c) << " " << differ << " elements differ from forward_fp8's bits";
}

}  // namespace

TEST(varlen_fp8) {
  REQUIRE_HOPPER();
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Batch c = ragged(DType::bf16, d, causal, gpu_test::fresh_seed());
      check_fp8_batch(c, d == 128 ? DType::s8 : DType::e4m3);
    }
}

// ---- batch invariance (ForwardOptions::batch_invariant, issue 18): a sequence's bits alone
// equal its bits inside batches of other random sequences, at any position, dense and packed.
namespace {

// out and lse of sequence `pos` of a packed batch (lengths sq, sk; the other sequences' data
// random from `seed`, the chosen one's from `own_seed`), as raw bits.
struct SequenceBits {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

SequenceBits packed_sequence_bits(DType dt, const std::vector<int>& sq, const std::vector<int>& sk, int pos, int d, bool causal,
                                  bool batch_invariant, uint64_t seed, uint64_t own_seed, int dv_ = 0) {
  const int dv = dv_ ? dv_ : d;  // v's (and out's) head dim
  const std::vector<int> cu_q = offsets(sq), cu_k = offsets(sk);
  const int B = static_cast<int>(sq.size());
  const int64_t H = 8, Hkv = 2, tq = cu_q[B], tk = cu_k[B];
  DeviceTensor q(dt, 1, tq, H, d, false), k(dt, 1, tk, Hkv, d, false),
      v(dt, 1, tk, Hkv, dv, false), out(dt, 1, tq, H, dv, false);
  q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2);
  // The chosen sequence's rows from own_seed, whatever its position.
  DeviceTensor oq(dt, 1, sq[pos], H, d, false), ok(dt, 1, sk[pos], Hkv, d, false),
      ov(dt, 1, sk[pos], Hkv, dv, false);
  oq.fill_normal(own_seed), ok.fill_normal(own_seed + 1), ov.fill_normal(own_seed + 2);
  cudaMemcpy(static_cast<uint16_t*>(q.view.data) + int64_t(cu_q[pos]) * H * d, oq.view.data, int64_t(sq[pos]) * H * d * 2,
             cudaMemcpyDeviceToDevice);
  cudaMemcpy(static_cast<uint16_t*>(k.view.data) + int64_t(cu_k[pos]) * Hkv * d, ok.view.data,
             int64_t(sk[pos]) * Hkv * d * 2, cudaMemcpyDeviceToDevice);
  cudaMemcpy(static_cast<uint16_t*>(v.view.data) + int64_t(cu_k[pos]) * Hkv * dv, ov.view.data,
             int64_t(sk[pos]) * Hkv * dv * 2, cudaMemcpyDeviceToDevice);
  out.poison();
  gpu_test::DeviceBuffer lse(H * tq * 4);
  warpattn::TensorView l = gpu_test::contiguous(lse.mem, DType::f32, {H, tq});
  DeviceInts dq(cu_q), dk(cu_k);
  warpattn::VarlenBatch batch;
  batch.cu_seqlens_q = dq.view, batch.cu_seqlens_k = dk.view;
  batch.max_seqlen_q = *std::max_element(sq.begin(), sq.end());
  warpattn::ForwardOptions o;
  o.causal = causal, o.batch_invariant = batch_invariant;
  warpattn::forward_varlen(packed(q.view), packed(k.view), packed(v.view), packed(out.view), l, batch, o);
  cudaDeviceSynchronize();
  const auto raw = out.raw();
  const auto all_lse = lse.get<float>();
  SequenceBits r;
  r.out.assign(raw.begin() + int64_t(cu_q[pos]) * H * dv, raw.begin() + int64_t(cu_q[pos + 1]) * H * dv);
  for (int64_t h = 0; h < H; ++h)
    r.lse.insert(r.lse.end(), all_lse.begin() + h * tq + cu_q[pos], all_lse.begin() + h * tq + cu_q[pos + 1]);
  return r;
}

bool same_bits(const SequenceBits& a, const SequenceBits& b) {
  return a.out == b.out && a.lse.size() == b.lse.size() &&
         memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

}  // namespace

TEST(batch_invariant_packed) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  std::mt19937_64 rng(seed);
  // Batches of 2, 7 and 64 sequences, both dtypes, every compiled head dim (q/k, v): the three
  // 16-bit kernels, MLA's 192/128 and the 512 kernel.
  const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}, {512, 512}};
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [d, dv] : dims)
      for (bool causal : {false, true}) {
        const SequenceBits alone = packed_sequence_bits(dt, {1500}, {1700}, 0, d, causal, true, seed, seed + 7, dv);
        const char* type = dt == DType::bf16 ? "bf16" : "f16";
        int checked = 0, differ = 0, default_differ = 0;
        for (int others : {1, 6, 63}) {
          std::vector<int> sq, sk;
          for (int i = 0; i < others; ++i) sq.push_back(1 + rng() % 3000), sk.push_back(1 + rng() % 3000);
          sq[0] = 4096, sk[0] = 4096;  // a long one: more tiles than one wave
          for (int pos : {0, others / 2, others}) {
            std::vector<int> q_len = sq, k_len = sk;
            q_len.insert(q_len.begin() + pos, 1500), k_len.insert(k_len.begin() + pos, 1700);
            const SequenceBits in_batch =
                packed_sequence_bits(dt, q_len, k_len, pos, d, causal, true, seed + 100 * pos, seed + 7, dv);
            differ += !same_bits(alone, in_batch);
            const SequenceBits by_default =
                packed_sequence_bits(dt, q_len, k_len, pos, d, causal, false, seed + 100 * pos, seed + 7, dv);
            default_differ += !same_bits(alone, by_default);
            ++checked;
          }
        }
        printf("    %s d=%d/%d %s: %d of %d batches differ from the sequence alone (default mode: %d)\n", type, d, dv,
               causal ? "causal" : "full", differ, checked, default_differ);
        CHECK(differ == 0) << type << " d=" << d << "/" << dv << (causal ? " causal" : " full") << ": batch-invariant mode differs in "
                           << differ << " of " << checked << " batches, seed " << seed;
      }
}

HARNESS_MAIN()
