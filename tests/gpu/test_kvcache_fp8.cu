// GPU tests of warpattn::forward_kvcache over an E4M3 cache (issue 16; warpattn.hpp,
// KvCache::k_descale; docs/decode-fp8-cache-design.md): dense and paged caches, the append of
// new rows into them, GQA packing, split keys, causal.
//  * The cache is filled on the host by the reference append (src/reference/fp8_cache.hpp) with
//    each sequence's first cache_seqlens[b] keys; every other byte of both allocations is a
//    fixed finite code (0x38: 1.0) that the attention must not see as a key of any sequence
//    (rows past a length are masked) and the append must not change.
//  * After the call, both allocations bitwise as the reference append leaves them: the new rows
//    quantised with their head's descale at cache_seqlens[b] + i (K rows, Vᵀ columns in the key
//    order), nothing else changed.
//  * out and lse against the fp64 reference on the dequantised cache and on q quantised as the
//    library does (one descale per work tile: amax / 448, hopper/decode/quantize_cache_q.hpp),
//    so that what remains is the kernel's own rounding (P in E4M3, as forward_fp8's tests:
//    relative L2 below 4e-2) and QGMMA's accumulation (lse within 2e-2).
// Skips with the reason where no sm_90 GPU exists.
#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/host_fp8.hpp"
#include "gpu_test_support.cuh"
#include "hopper/decode/decode_plan.hpp"
#include "reference/fp8_cache.hpp"
#include "reference/reference.hpp"

using gpu_test::DeviceBuffer;
using gpu_test::DeviceInts;
using warpattn::DType;

namespace {

constexpr uint8_t kFiller = 0x38;  // e4m3 1.0

struct Case {
  DType dtype = DType::bf16;
  int head_dim = 128;
  int64_t heads_q = 8, heads_kv = 2, seqlen_q = 1;
  int64_t s_cache = 0;              // dense: keys per sequence (a multiple of 16)
  int page_size = 0, max_pages = 0;  // paged
  std::vector<int> cache_seqlens;    // the batch
  int64_t s_new = 0;
  bool causal = false;
  int window_left = -1, window_right = -1;  // a sliding window (ForwardOptions')
  int num_splits = 0;
};

std::string describe(const Case& c) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s d=%d %s %s B=%zu Sq=%lld Hq=%lld Hkv=%lld new=%lld splits=%d",
           c.dtype == DType::bf16 ? "bf16" : "fp16", c.head_dim, c.causal ? "causal" : "full",
           c.page_size > 0 ? ("paged " + std::to_string(c.max_pages) + "x" + std::to_string(c.page_size)).c_str()
                           : ("dense " + std::to_string(c.s_cache)).c_str(),
           c.cache_seqlens.size(), (long long)c.seqlen_q, (long long)c.heads_q, (long long)c.heads_kv,
           (long long)c.s_new, c.num_splits);
  return buf + gpu_test::describe_model_options(c.window_left, c.window_right, 0.f, false);
}

float round16(float x, DType t) {
  return t == DType::bf16 ? warpattn::host::bf16_to_float(warpattn::host::float_to_bf16(x))
                          : warpattn::host::f16_to_float(warpattn::host::float_to_f16(x));
}
uint16_t bits16(float x, DType t) {
  return t == DType::bf16 ? warpattn::host::float_to_bf16(x) : warpattn::host::float_to_f16(x);
}

void run_case(const Case& c) {
  const uint64_t seed = gpu_test::fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int B = static_cast<int>(c.cache_seqlens.size());
  const bool paged = c.page_size > 0;
  const int64_t H = c.heads_q, Hkv = c.heads_kv, D = c.head_dim, Sq = c.seqlen_q, Sn = c.s_new;
  const int64_t page_keys = paged ? c.page_size : c.s_cache;
  const int64_t cap = paged ? int64_t(c.max_pages) * c.page_size : c.s_cache;
  // Pages: a random permutation, two spare; dense: one page per sequence.
  const int num_pages = paged ? B * c.max_pages + 2 : B;
  std::vector<std::vector<int>> tables(B);
  std::vector<int> table_flat;
  {
    std::vector<int> perm(num_pages);
    for (int i = 0; i < num_pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int b = 0; b < B; ++b) {
      if (paged)
        for (int s = 0; s < c.max_pages; ++s) tables[b].push_back(perm[b * c.max_pages + s]);
      else
        tables[b].push_back(b);
      table_flat.insert(table_flat.end(), tables[b].begin(), tables[b].end());
    }
  }
  const warpattn::detail::Fp8CacheShape shape{num_pages, page_keys, Hkv, D};
  const size_t cache_bytes = static_cast<size_t>(num_pages) * page_keys * Hkv * D;
  std::vector<float> k_descale(Hkv), v_descale(Hkv);
  for (int64_t h = 0; h < Hkv; ++h) k_descale[h] = (4.f + h) / 448.f, v_descale[h] = (3.f + 0.5f * h) / 448.f;
  // The cached keys (logical, per sequence) through the reference append.
  std::vector<uint8_t> k_pages(cache_bytes, kFiller), vt_pages(cache_bytes, kFiller);
  std::vector<int64_t> cached(B), len(B);
  for (int b = 0; b < B; ++b) {
    cached[b] = std::clamp<int64_t>(c.cache_seqlens[b], 0, cap);
    len[b] = std::min(cached[b] + Sn, cap);
    std::vector<float> kk(cached[b] * Hkv * D), vv(cached[b] * Hkv * D);
    for (float& x : kk) x = normal(rng);
    for (float& x : vv) x = normal(rng);
    warpattn::reference::append_fp8_cache(shape, k_pages, vt_pages, tables[b], 0, cached[b], kk, vv, k_descale,
                                          v_descale);
  }
  // New rows (16-bit), and the caches as the call should leave them.
  std::vector<uint16_t> kn_bits(B * Sn * Hkv * D), vn_bits(B * Sn * Hkv * D);
  std::vector<uint8_t> k_want = k_pages, vt_want = vt_pages;
  for (int b = 0; b < B; ++b) {
    std::vector<float> kk(Sn * Hkv * D), vv(Sn * Hkv * D);
    for (size_t i = 0; i < kk.size(); ++i) {
      kk[i] = round16(normal(rng), c.dtype), vv[i] = round16(normal(rng), c.dtype);
      kn_bits[b * kk.size() + i] = bits16(kk[i], c.dtype), vn_bits[b * kk.size() + i] = bits16(vv[i], c.dtype);
    }
    const int64_t rows = std::max<int64_t>(0, std::min(Sn, cap - cached[b]));
    warpattn::reference::append_fp8_cache(shape, k_want, vt_want, tables[b], cached[b], rows, kk, vv, k_descale,
                                          v_descale);
  }
  std::vector<float> qf(B * Sq * H * D);
  std::vector<uint16_t> q_bits(qf.size());
  for (size_t i = 0; i < qf.size(); ++i) qf[i] = round16(normal(rng), c.dtype), q_bits[i] = bits16(qf[i], c.dtype);

  DeviceBuffer kc(cache_bytes), vc(cache_bytes), q(q_bits.size() * 2), out(q_bits.size() * 2),
      lse(B * H * Sq * 4), kn(std::max<size_t>(kn_bits.size(), 1) * 2), vn(std::max<size_t>(vn_bits.size(), 1) * 2),
      kds(Hkv * 4), vds(Hkv * 4);
  cudaMemcpy(kc.mem, k_pages.data(), cache_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(vc.mem, vt_pages.data(), cache_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(q.mem, q_bits.data(), q_bits.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(kn.mem, kn_bits.data(), kn_bits.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(vn.mem, vn_bits.data(), vn_bits.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(kds.mem, k_descale.data(), Hkv * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(vds.mem, v_descale.data(), Hkv * 4, cudaMemcpyHostToDevice);
  DeviceInts dseqlens(c.cache_seqlens), dtable(table_flat);
  warpattn::KvCache cache;
  cache.k_cache = gpu_test::contiguous(kc.mem, DType::e4m3, {num_pages, page_keys, Hkv, D});
  cache.v_cache = gpu_test::contiguous(vc.mem, DType::e4m3, {num_pages, Hkv, page_keys / 16, 16 * D});
  cache.k_descale = gpu_test::contiguous(kds.mem, DType::f32, {Hkv});
  cache.v_descale = gpu_test::contiguous(vds.mem, DType::f32, {Hkv});
  cache.cache_seqlens = dseqlens.view;
  if (paged) cache.block_table = gpu_test::contiguous(dtable.mem, DType::s32, {B, c.max_pages});
  if (Sn > 0) {
    cache.k = gpu_test::contiguous(kn.mem, c.dtype, {B, Sn, Hkv, D});
    cache.v = gpu_test::contiguous(vn.mem, c.dtype, {B, Sn, Hkv, D});
  }
  cache.num_splits = c.num_splits;
  warpattn::ForwardOptions options;
  options.causal = c.causal;
  options.window_left = c.window_left, options.window_right = c.window_right;
  const warpattn::TensorView qv = gpu_test::contiguous(q.mem, c.dtype, {B, Sq, H, D});
  const warpattn::TensorView ov = gpu_test::contiguous(out.mem, c.dtype, {B, Sq, H, D});
  const warpattn::TensorView lv = gpu_test::contiguous(lse.mem, DType::f32, {B, H, Sq});
  try {
    warpattn::forward_kvcache(qv, cache, ov, lv, options);
  } catch (const std::exception& e) {
    CHECK(false) << describe(c) << " threw: " << e.what();
    return;
  }
  const cudaError_t err = cudaDeviceSynchronize();
  REQUIRE(err == cudaSuccess) << describe(c) << " failed: " << cudaGetErrorString(err) << " seed " << seed;

  // The caches, bitwise.
  const auto k_got = kc.get<uint8_t>(), vt_got = vc.get<uint8_t>();
  int64_t k_wrong = 0, vt_wrong = 0;
  for (size_t i = 0; i < cache_bytes; ++i) k_wrong += k_got[i] != k_want[i], vt_wrong += vt_got[i] != vt_want[i];

  // q as the library quantises it: one descale per work tile (positions x packed heads).
  const warpattn::detail::GqaPacking packing = warpattn::detail::gqa_packing(static_cast<int>(H / Hkv), 128);
  std::vector<float> qd(qf.size());
  for (int b = 0; b < B; ++b)
    for (int64_t chunk = 0; chunk < H / packing.heads; ++chunk)
      for (int64_t m = 0; m * packing.positions < Sq; ++m) {
        float amax = 0.f;
        const int64_t p_end = std::min<int64_t>(Sq, (m + 1) * packing.positions);
        auto at = [&](int64_t p, int64_t h, int64_t d) { return ((b * Sq + p) * H + chunk * packing.heads + h) * D + d; };
        for (int64_t p = m * packing.positions; p < p_end; ++p)
          for (int64_t h = 0; h < packing.heads; ++h)
            for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(qf[at(p, h, d)]));
        const float ds = amax > 0.f ? amax / 448.f : 1.f;
        for (int64_t p = m * packing.positions; p < p_end; ++p)
          for (int64_t h = 0; h < packing.heads; ++h)
            for (int64_t d = 0; d < D; ++d)
              qd[at(p, h, d)] = warpattn::host::e4m3_to_float(warpattn::host::float_to_e4m3(qf[at(p, h, d)] / ds)) * ds;
      }
  // Each sequence against its dequantised keys.
  const auto got = out.get<uint16_t>();
  const auto got_lse = lse.get<float>();
  double err2 = 0, ref2 = 0, lse_err = 0;
  int64_t nan = 0;
  for (int b = 0; b < B; ++b) {
    std::vector<float> kd(std::max<int64_t>(len[b], 1) * Hkv * D), vd(kd.size());
    for (int64_t j = 0; j < len[b]; ++j) {
      const int page = tables[b][j / page_keys];
      const int row = static_cast<int>(j % page_keys);
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < D; ++d) {
          kd[(j * Hkv + h) * D + d] =
              warpattn::host::e4m3_to_float(k_want[warpattn::detail::fp8_cache_k_offset(shape, page, row, h, d)]) *
              k_descale[h];
          vd[(j * Hkv + h) * D + d] =
              warpattn::host::e4m3_to_float(vt_want[warpattn::detail::fp8_cache_vt_offset(shape, page, row, h, d)]) *
              v_descale[h];
        }
    }
    warpattn::reference::AttentionShape s{1, Sq, len[b], H, Hkv, D, 1.0 / std::sqrt(double(D)), c.causal};
    s.window_left = c.window_left, s.window_right = c.window_right;
    std::vector<double> want(Sq * H * D), want_lse(H * Sq);
    warpattn::reference::attention(s, qd.data() + b * Sq * H * D, kd.data(), vd.data(), want.data(), want_lse.data());
    for (int64_t i = 0; i < Sq * H * D; ++i) {
      const float g = c.dtype == DType::bf16 ? warpattn::host::bf16_to_float(got[b * Sq * H * D + i])
                                             : warpattn::host::f16_to_float(got[b * Sq * H * D + i]);
      nan += std::isnan(g);
      err2 += (g - want[i]) * (g - want[i]);
      ref2 += want[i] * want[i];
    }
    for (int64_t i = 0; i < H * Sq; ++i) {
      const double w = want_lse[i], g = got_lse[b * H * Sq + i];
      if (std::isinf(w)) {
        lse_err = gpu_test::worse(lse_err, g == w ? 0.0 : INFINITY);
        continue;
      }
      lse_err = gpu_test::worse(lse_err, std::fabs(g - w));
    }
  }
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 == 0 ? 0 : INFINITY);
  const bool ok = nan == 0 && rel < 4e-2 && lse_err <= 2e-2 && k_wrong == 0 && vt_wrong == 0;
  printf("    %-80s relL2 %.2e lse %.1e cache %lld/%lld  %s\n", describe(c).c_str(), rel, lse_err, (long long)k_wrong,
         (long long)vt_wrong, ok ? "ok" : "FAIL");
  CHECK(nan == 0) << describe(c) << ": " << nan << " NaN outputs, seed " << seed;
  CHECK(rel < 4e-2) << describe(c) << ": relative L2 " << rel << " against the dequantised reference, seed " << seed;
  CHECK(lse_err <= 2e-2) << describe(c) << ": LSE off by " << lse_err << ", seed " << seed;
  CHECK(k_wrong == 0) << describe(c) << ": " << k_wrong << " K cache bytes not as the reference append, seed " << seed;
  CHECK(vt_wrong == 0) << describe(c) << ": " << vt_wrong << " Vᵀ cache bytes not as the reference append, seed "
                       << seed;
}

Case dense(int d, DType t = DType::bf16) {
  Case c;
  c.dtype = t, c.head_dim = d, c.s_cache = 1024;
  c.cache_seqlens = {0, 1, 127, 128, 129, 700, 1023};
  c.s_new = 1;
  return c;
}

}  // namespace

TEST(kvcache_fp8_dense) {
  REQUIRE_HOPPER();
  for (int d : {64, 128})
    for (DType t : {DType::bf16, DType::f16}) run_case(dense(d, t));
}

// A dense cache at head dim d without an append: whole, then causal with 4 query rows.
void run_no_append_full_and_causal(int d) {
  Case c = dense(d);
  c.s_new = 0;
  c.cache_seqlens = {1024, 5, 300};
  run_case(c);
  c.causal = true;
  c.seqlen_q = 4;
  run_case(c);
}

// Chunked prefill at head dim d: Sq = S_new, causal, rows past the capacity dropped.
void run_append_many_rows(int d) {
  Case c = dense(d);
  c.seqlen_q = c.s_new = 200;
  c.causal = true;
  c.cache_seqlens = {0, 100, 900, 1024};
  run_case(c);
}

// Paged caches at head dim d, one per page size, two new rows each (causal where the page is a
// multiple of 32 keys).
void run_paged(int d, std::initializer_list<int> pages) {
  for (int page : pages) {
    Case c;
    c.head_dim = d;
    c.page_size = page, c.max_pages = (1024 + page - 1) / page;
    c.cache_seqlens = {0, 17, 255, 256, 800};
    c.s_new = 2;
    c.seqlen_q = 2;
    c.causal = page % 32 == 0;
    run_case(c);
  }
}

TEST(kvcache_fp8_dense_no_append_full_and_causal) {
  REQUIRE_HOPPER();
  for (int d : {64, 128}) run_no_append_full_and_causal(d);
}

TEST(kvcache_fp8_append_many_rows) {
  REQUIRE_HOPPER();
  run_append_many_rows(128);
}

TEST(kvcache_fp8_paged) {
  REQUIRE_HOPPER();
  run_paged(128, {16, 32, 48, 64, 128, 256});
  Case c;
  c.head_dim = 64, c.page_size = 16, c.max_pages = 40, c.cache_seqlens = {600, 3};
  c.s_new = 1;
  run_case(c);
}

// Dense caches at head dim d with query heads / KV heads `groups` (GQA packing), then forced
// split counts `splits` (the pieces and their combine).
void run_gqa_and_splits(int d, std::initializer_list<std::pair<int64_t, int64_t>> groups,
                        std::initializer_list<int> splits) {
  for (const auto& [heads_q, heads_kv] : groups) {
    Case c = dense(d);
    c.heads_q = heads_q, c.heads_kv = heads_kv;
    c.cache_seqlens = {1024, 333};
    run_case(c);
  }
  for (int n : splits) {
    Case c = dense(d);
    c.num_splits = n;
    c.cache_seqlens = {1000, 50, 1024};
    run_case(c);
  }
}

TEST(kvcache_fp8_gqa_and_splits) {
  REQUIRE_HOPPER();
  run_gqa_and_splits(128, {{8, 8}, {32, 8}, {16, 1}, {64, 2}}, {1, 2, 7, 16});
}

// Head dim 256: the lean producer's kernel (decode/lean_cache_producer.cuh: its cache issuers'
// box walk over pages of 16 (4 issuers, 2 boxes each), 48, 64 (2 issuers) and 256 keys (one
// box, one issuer)) and consumer.cuh's kLeanRegisters (elected slot releases, the mask from the
// thread's first column, banded and not). A few cases: the same checks as d = 64 and 128.
TEST(kvcache_fp8_d256) {
  REQUIRE_HOPPER();
  for (DType t : {DType::bf16, DType::f16}) run_case(dense(256, t));
  run_no_append_full_and_causal(256);
  run_append_many_rows(256);
  run_paged(256, {16, 48, 64, 256});
  run_gqa_and_splits(256, {{32, 8}}, {2, 7});
}

// Sliding windows over an E4M3 cache: the consumers' left-edge masking (mask_scores with
// kLeftEdge; at d = 256 relative to the thread's first column, kThreadCols) and the key tiles
// skipped left of the window, causal and not, dense and paged, whole and split, at each head
// dim of the cache.
TEST(kvcache_fp8_window) {
  REQUIRE_HOPPER();
  for (int d : {64, 128, 256}) {
    {  // decode with an append, causal, a window shorter than a key tile
      Case c = dense(d);
      c.seqlen_q = c.s_new = 4;
      c.causal = true, c.window_left = 40;
      c.cache_seqlens = {0, 1, 127, 700, 1020};
      run_case(c);
    }
    {  // no append, both sides, the left edge across key tiles
      Case c = dense(d);
      c.s_new = 0;
      c.window_left = 300, c.window_right = 8;
      c.cache_seqlens = {1024, 5, 600};
      run_case(c);
    }
    {  // paged, split, the edge inside a tile
      Case c;
      c.head_dim = d;
      c.page_size = 64, c.max_pages = 16;
      c.cache_seqlens = {1024, 129, 900};
      c.seqlen_q = c.s_new = 2;
      c.causal = true, c.window_left = 130;
      c.num_splits = 3;
      run_case(c);
    }
  }
}

HARNESS_MAIN()
