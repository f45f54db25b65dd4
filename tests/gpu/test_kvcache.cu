// GPU tests of warpattn::forward_kvcache (decode over KV caches, dense and paged, with the
// optional append of new keys and values): every sequence's out and lse against the fp64
// reference on that sequence's first len_b keys, gathered on the host from the cache as the
// call should leave it, len_b = min(clamp(cache_seqlens[b], 0, capacity) + S_new, capacity).
// Around that:
//  * out and lse poisoned (NaN) before each call; nothing written outside their views; rows
//    that see no key exactly 0 with lse -inf (or the row's sink);
//  * every cache element a sequence does not hold (rows past its length, pages no sequence
//    uses, pages past a sequence's used ones) large finite garbage (~1e4) that must not change
//    the result; the gaps of strided caches NaN (never read);
//  * after an append, the whole cache allocation bitwise as expected: the new rows exactly at
//    cache_seqlens[b] + i (rows past the capacity and rows whose page index is outside the
//    cache dropped), every other element (untouched pages, the gaps) unchanged;
//  * block tables from a random permutation of the pages (no page shared), their entries past a
//    sequence's used pages -1, huge, one past the last page or an unused page;
//  * a dense and a paged call on the same logical data: the same bits;
//  * invalid arguments throw warpattn::Error and write nothing.
// Skips with the reason where no sm_90 GPU exists.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_support.cuh"
#include "reference/reference.hpp"

using gpu_test::DeviceInts;
using gpu_test::DeviceTensor;
using gpu_test::parallel_for;
using warpattn::DType;

namespace {

uint16_t to_bits(float x, DType t) {
  return t == DType::bf16 ? warpattn::host::float_to_bf16(x) : warpattn::host::float_to_f16(x);
}
float from_bits(uint16_t b, DType t) {
  return t == DType::bf16 ? warpattn::host::bf16_to_float(b) : warpattn::host::f16_to_float(b);
}

// N(0, 1) from a counter hash (the host twin of fill_normal_kernel's draw).
float hash_normal(uint64_t seed, uint64_t i) {
  const uint64_t r = gpu_test::splitmix64(seed ^ (i * 0xD1B54A32D192ED03ull));
  const float u1 = (static_cast<float>(r >> 40) + 1.f) / 16777217.f;  // (0, 1]
  const float u2 = static_cast<float>((r >> 16) & 0xFFFFFF) / 16777216.f;
  return std::sqrt(-2.f * std::log(u1)) * std::cos(6.283185307f * u2);
}

// Large finite garbage for cache elements no sequence holds: +-6000 .. 14000 (finite in fp16).
float garbage(uint64_t i) { return ((i & 1) ? 1.f : -1.f) * (6000.f + static_cast<float>(i % 8009)); }

// A test case: the problem, the cache's layout and lengths, the append, the model options.
struct Case {
  DType dtype = DType::bf16;
  int head_dim = 128;
  int64_t heads_q = 8, heads_kv = 2;
  int64_t seqlen_q = 1;
  bool causal = false;
  bool with_lse = true;
  bool padded = false;  // strided q, out, lse, caches, new rows and block table
  // Dense (page_size 0): s_cache rows per sequence. Paged: max_pages pages of page_size each.
  int64_t s_cache = 0;
  int page_size = 0, max_pages = 0;
  int spare_pages = 2;  // pages no table entry names (never read, never written)
  // Block-table entries (sequence, slot) inside the used pages set to -1: their keys read as
  // zeros and appends there are dropped (warpattn.hpp: "never read (its keys read as zeros)").
  std::vector<std::pair<int, int>> invalid_slots;
  // One per sequence (the batch); with pass_seqlens false they are not given (full caches).
  std::vector<int> cache_seqlens;
  bool pass_seqlens = true;
  int64_t s_new = 0;  // new rows appended (0: no k, v)
  int window_left = -1, window_right = -1;
  bool sinks = false;
  int num_splits = 0;  // KvCache::num_splits (0: chosen from the shape)
};

int64_t capacity(const Case& c) { return c.page_size > 0 ? int64_t(c.max_pages) * c.page_size : c.s_cache; }

std::string describe(const Case& c) {
  char buf[320];
  std::string lens;
  if (!c.pass_seqlens) {
    lens = "full";
  } else {
    for (size_t b = 0; b < c.cache_seqlens.size() && b < 8; ++b)
      lens += (b ? "," : "") + std::to_string(c.cache_seqlens[b]);
    if (c.cache_seqlens.size() > 8) lens += ",...";
  }
  char layout[64];
  if (c.page_size > 0)
    snprintf(layout, sizeof layout, "paged %dx%d", c.max_pages, c.page_size);
  else
    snprintf(layout, sizeof layout, "dense %lld", (long long)c.s_cache);
  snprintf(buf, sizeof buf, "%s d=%d %s %s B=%zu Sq=%lld Hq=%lld Hkv=%lld new=%lld lens=[%s]%s%s%s",
           c.dtype == DType::bf16 ? "bf16" : "fp16", c.head_dim, c.causal ? "causal" : "full", layout,
           c.cache_seqlens.size(), (long long)c.seqlen_q, (long long)c.heads_q, (long long)c.heads_kv,
           (long long)c.s_new, lens.c_str(), c.padded ? " strided" : "", c.with_lse ? "" : " no-lse",
           c.invalid_slots.empty() ? "" : " invalid-pages");
  return buf + gpu_test::describe_model_options(c.window_left, c.window_right, 0.f, c.sinks);
}

// Where each sequence's keys live: dense (page = the sequence) or through the block table.
struct Layout {
  bool paged = false;
  int64_t capacity = 0;
  int page_size = 0, max_pages = 0, num_pages = 0;
  int64_t table_stride = 0;
  std::vector<int> table;             // B x table_stride entries
  std::vector<int> owner, owner_slot;  // per page: the sequence and slot naming it, or -1

  // The (page, row) of key `key` of sequence b; page -1 where the table names no page of the
  // cache.
  std::pair<int, int> locate(int b, int64_t key) const {
    if (!paged) return {b, static_cast<int>(key)};
    const int t = table[b * table_stride + key / page_size];
    if (t < 0 || t >= num_pages) return {-1, 0};
    return {t, static_cast<int>(key % page_size)};
  }
};

Layout make_layout(const Case& c, const std::vector<int64_t>& len, uint64_t seed) {
  Layout l;
  const int B = static_cast<int>(c.cache_seqlens.size());
  l.paged = c.page_size > 0;
  l.capacity = capacity(c);
  if (!l.paged) {
    l.num_pages = B;
    return l;
  }
  l.page_size = c.page_size, l.max_pages = c.max_pages;
  l.table_stride = std::max<int64_t>(c.max_pages + (c.padded ? 3 : 0), 1);
  std::mt19937_64 rng(seed ^ 0x7AB1E5EEDull);
  // Kinds of entry: 0 a page of the sequence's keys; past the used pages 1 -1, 2 INT_MAX, 3 one
  // past the last page, 4 2^30 + something, 5 an unused page of the cache (read past the
  // length only: masked); 1 also for the invalid slots asked for.
  std::vector<int> kind(static_cast<size_t>(B) * c.max_pages, 0);
  int needed = 0;
  for (int b = 0; b < B; ++b) {
    const int64_t used = (len[b] + c.page_size - 1) / c.page_size;
    for (int s = 0; s < c.max_pages; ++s) {
      int& k = kind[size_t(b) * c.max_pages + s];
      k = s < used ? 0 : 1 + static_cast<int>(rng() % 5);
      needed += k == 0 || k == 5;
    }
  }
  for (const auto& [b, s] : c.invalid_slots) {
    int& k = kind[size_t(b) * c.max_pages + s];
    needed -= k == 0 || k == 5;
    k = 1;
  }
  l.num_pages = std::max(needed + c.spare_pages, 1);
  std::vector<int> perm(l.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  l.table.assign(static_cast<size_t>(B) * l.table_stride, 0);
  l.owner.assign(l.num_pages, -1);
  l.owner_slot.assign(l.num_pages, -1);
  int next = 0;
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < c.max_pages; ++s) {
      int& e = l.table[size_t(b) * l.table_stride + s];
      switch (kind[size_t(b) * c.max_pages + s]) {
        case 0:
        case 5:
          e = perm[next++];
          l.owner[e] = b, l.owner_slot[e] = s;
          break;
        case 1: e = -1; break;
        case 2: e = INT_MAX; break;
        case 3: e = l.num_pages; break;
        default: e = (1 << 30) + static_cast<int>(rng() % 1000); break;
      }
    }
  return l;
}

// The outputs of a case as bits (logical order), for comparisons between calls.
struct Outcome {
  bool ran = false;
  std::vector<float> out;  // [B][Sq][Hq][D]
  std::vector<float> lse;  // [B][Hq][Sq] (empty without lse)
};

double tolerance(DType t) { return t == DType::bf16 ? 5e-3 : 1e-3; }

// Runs forward_kvcache on the case and checks everything described at the top.
Outcome run_case(const Case& c, uint64_t seed) {
  Outcome res;
  const int B = static_cast<int>(c.cache_seqlens.size());
  const bool paged = c.page_size > 0;
  const int64_t cap = capacity(c), H = c.heads_q, Hkv = c.heads_kv, D = c.head_dim, Sq = c.seqlen_q, Sn = c.s_new;
  std::vector<int64_t> cached(B), len(B);
  for (int b = 0; b < B; ++b) {
    cached[b] = c.pass_seqlens ? std::clamp<int64_t>(c.cache_seqlens[b], 0, cap) : cap;
    len[b] = std::min(cached[b] + Sn, cap);
  }
  const Layout lay = make_layout(c, len, seed);

  // The caches: every element of the view a sequence holds (its first `cached` keys) from the
  // logical data (keyed by sequence and key, so dense and paged layouts agree), the rest of the
  // view garbage, the gaps NaN.
  const int64_t pages = paged ? lay.num_pages : B, rows = paged ? c.page_size : cap;
  DeviceTensor kc(c.dtype, pages, rows, Hkv, D, c.padded), vc(c.dtype, pages, rows, Hkv, D, c.padded);
  std::vector<uint16_t> k_before(kc.alloc_elems, 0xFFFF), v_before(vc.alloc_elems, 0xFFFF);
  {
    const int64_t* st = kc.view.stride;
    const uint64_t seed_k = seed ^ 0x4B4B4B4Bull, seed_v = seed ^ 0x56565656ull;
    for (int64_t p = 0; p < pages; ++p)
      for (int64_t r = 0; r < rows; ++r) {
        int b = -1;
        int64_t key = 0;
        if (!paged) {
          b = static_cast<int>(p), key = r;
        } else if (lay.owner[p] >= 0) {
          b = lay.owner[p], key = int64_t(lay.owner_slot[p]) * c.page_size + r;
        }
        const bool held = b >= 0 && key < cached[b];
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t at = p * st[0] + r * st[1] + h * st[2] + d;
            const uint64_t logical = ((uint64_t(b) * cap + key) * Hkv + h) * D + d;
            k_before[at] = to_bits(held ? hash_normal(seed_k, logical) : garbage(at), c.dtype);
            v_before[at] = to_bits(held ? hash_normal(seed_v, logical) : -garbage(at + 1), c.dtype);
          }
      }
  }
  kc.upload(k_before);
  vc.upload(v_before);

  DeviceTensor q(c.dtype, B, Sq, H, D, c.padded), out(c.dtype, B, Sq, H, D, c.padded);
  q.fill_normal(seed + 1);
  out.poison();
  std::unique_ptr<DeviceTensor> kn, vn;
  if (Sn > 0) {
    kn = std::make_unique<DeviceTensor>(c.dtype, B, Sn, Hkv, D, c.padded);
    vn = std::make_unique<DeviceTensor>(c.dtype, B, Sn, Hkv, D, c.padded);
    kn->fill_normal(seed + 2);
    vn->fill_normal(seed + 3);
  }
  // lse (B, Hq, Sq), strided when the tensors are.
  const int64_t lrs = c.padded ? 2 : 1, lhs = Sq * lrs + (c.padded ? 4 : 0), lbs = H * lhs;
  const int64_t lse_elems = B * lbs + 8;
  gpu_test::DeviceBuffer lse_mem(lse_elems * 4);  // 0xFF: NaN
  std::optional<warpattn::TensorView> lse;
  if (c.with_lse) {
    warpattn::TensorView l;
    l.data = lse_mem.mem, l.dtype = DType::f32, l.rank = 3;
    l.shape[0] = B, l.shape[1] = H, l.shape[2] = Sq;
    l.stride[0] = lbs, l.stride[1] = lhs, l.stride[2] = lrs;
    lse = l;
  }
  DeviceInts dseqlens(c.cache_seqlens), dtable(paged ? lay.table : std::vector<int>{0});
  warpattn::TensorView table_view = dtable.view;
  table_view.rank = 2;
  table_view.shape[0] = B, table_view.shape[1] = c.max_pages;
  table_view.stride[0] = lay.table_stride, table_view.stride[1] = 1;

  warpattn::ForwardOptions options;
  options.causal = c.causal;
  options.window_left = c.window_left, options.window_right = c.window_right;
  std::vector<float> sinks_host;
  gpu_test::DeviceBuffer sinks_mem(H * 4);
  if (c.sinks) {
    std::mt19937_64 draw(seed + 4);
    std::normal_distribution<float> normal(0.f, 2.f);
    for (int64_t h = 0; h < H; ++h) sinks_host.push_back(normal(draw));
    cudaMemcpy(sinks_mem.mem, sinks_host.data(), H * 4, cudaMemcpyHostToDevice);
    options.sinks = gpu_test::contiguous(sinks_mem.mem, DType::f32, {H});
  }
  warpattn::KvCache cache;
  cache.k_cache = kc.view, cache.v_cache = vc.view;
  if (c.pass_seqlens) cache.cache_seqlens = dseqlens.view;
  if (paged) cache.block_table = table_view;
  cache.num_splits = c.num_splits;
  if (Sn > 0) cache.k = kn->view, cache.v = vn->view;
  CUDA_OK(cudaDeviceSynchronize());
  try {
    warpattn::forward_kvcache(q.view, cache, out.view, lse, options);
  } catch (const std::exception& e) {
    CHECK(false) << describe(c) << " threw: " << e.what();
    return res;
  }
  const cudaError_t err = cudaDeviceSynchronize();
  REQUIRE(err == cudaSuccess) << describe(c) << " kernel failed: " << cudaGetErrorString(err) << " seed " << seed;
  res.ran = true;

  // The caches as the call should leave them: the new rows at cached[b] + i, where inside the
  // capacity and on a page of the cache.
  std::vector<uint16_t> k_want = k_before, v_want = v_before;
  if (Sn > 0) {
    const auto kn_raw = kn->raw(), vn_raw = vn->raw();
    const int64_t* st = kc.view.stride;
    const int64_t* ns = kn->view.stride;
    for (int b = 0; b < B; ++b)
      for (int64_t i = 0; i < Sn; ++i) {
        const int64_t key = cached[b] + i;
        if (key >= cap) continue;
        const auto [p, r] = lay.locate(b, key);
        if (p < 0) continue;
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            k_want[p * st[0] + r * st[1] + h * st[2] + d] = kn_raw[b * ns[0] + i * ns[1] + h * ns[2] + d];
            v_want[p * st[0] + r * st[1] + h * st[2] + d] = vn_raw[b * ns[0] + i * ns[1] + h * ns[2] + d];
          }
      }
  }
  const auto k_got = kc.raw(), v_got = vc.raw();
  int64_t append_wrong = 0, other_changed = 0;
  for (const auto* t : {&k_got, &v_got}) {
    const auto& want = t == &k_got ? k_want : v_want;
    const auto& before = t == &k_got ? k_before : v_before;
    for (size_t i = 0; i < want.size(); ++i)
      if ((*t)[i] != want[i]) ++(want[i] != before[i] ? append_wrong : other_changed);
  }

  // Each sequence's keys and values 0 .. len, gathered from the expected cache (zeros where the
  // table names no page of the cache).
  std::vector<std::vector<float>> kseq(B), vseq(B);
  {
    const int64_t* st = kc.view.stride;
    for (int b = 0; b < B; ++b) {
      kseq[b].assign(static_cast<size_t>(std::max<int64_t>(len[b], 1) * Hkv * D), 0.f);
      vseq[b].assign(kseq[b].size(), 0.f);
      for (int64_t j = 0; j < len[b]; ++j) {
        const auto [p, r] = lay.locate(b, j);
        if (p < 0) continue;
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t at = p * st[0] + r * st[1] + h * st[2] + d;
            kseq[b][(j * Hkv + h) * D + d] = from_bits(k_want[at], c.dtype);
            vseq[b][(j * Hkv + h) * D + d] = from_bits(v_want[at], c.dtype);
          }
      }
    }
  }
  const auto qf = q.logical(q.raw());
  const auto out_raw = out.raw();
  const auto got = out.logical(out_raw);
  const auto lse_host = lse_mem.get<float>();
  const auto shape_of = [&](int b) {
    warpattn::reference::AttentionShape s{1, Sq, len[b], H, Hkv, D, 1.0 / std::sqrt(double(D)), c.causal};
    s.window_left = c.window_left, s.window_right = c.window_right;
    s.sinks = c.sinks ? sinks_host.data() : nullptr;
    return s;
  };

  // Rows against the reference: all of short problems, else the first and last few and random
  // ones of each (sequence, head).
  struct Row {
    int b;
    int64_t h, row;
  };
  std::vector<Row> check_rows;
  std::mt19937_64 rng(seed);
  for (int b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      if (Sq * std::max<int64_t>(len[b], 1) <= 20000) {
        for (int64_t r = 0; r < Sq; ++r) check_rows.push_back({b, h, r});
        continue;
      }
      std::vector<int64_t> pick = {0, 1, Sq - 2, Sq - 1};
      for (int i = 0; i < 12; ++i) pick.push_back(static_cast<int64_t>(rng() % Sq));
      std::sort(pick.begin(), pick.end());
      pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
      for (int64_t r : pick)
        if (r >= 0 && r < Sq) check_rows.push_back({b, h, r});
    }
  std::vector<double> want(check_rows.size() * D), want_lse(check_rows.size());
  parallel_for(static_cast<int64_t>(check_rows.size()), [&](int64_t i) {
    const Row& r = check_rows[i];
    warpattn::reference::attention_row(shape_of(r.b), qf.data() + int64_t(r.b) * Sq * H * D, kseq[r.b].data(),
                                       vseq[r.b].data(), 0, r.h, r.row, &want[i * D], &want_lse[i]);
  });
  std::vector<float> got_rows(check_rows.size() * D);
  double lse_err = 0;
  for (size_t i = 0; i < check_rows.size(); ++i) {
    const Row& r = check_rows[i];
    std::copy_n(&got[((r.b * Sq + r.row) * H + r.h) * D], D, &got_rows[i * D]);
    if (!c.with_lse) continue;
    const double g = lse_host[r.b * lbs + r.h * lhs + r.row * lrs], w = want_lse[i];
    lse_err = gpu_test::worse(lse_err, std::isinf(w) ? (g == w ? 0.0 : INFINITY) : std::fabs(g - w));
  }
  const auto stats = warpattn::reference::compare(got_rows.data(), want.data(), static_cast<int64_t>(want.size()));

  // Every row that sees no key (a sequence of length 0, a causal row above the diagonal, a
  // window outside the keys): out exactly 0, lse -inf or the head's sink.
  int64_t empty_rows = 0, empty_wrong = 0;
  for (int b = 0; b < B; ++b) {
    const auto s = shape_of(b);
    for (int64_t row = 0; row < Sq; ++row) {
      if (warpattn::reference::visible_keys(s, row) > 0) continue;
      for (int64_t h = 0; h < H; ++h) {
        ++empty_rows;
        bool wrong = false;
        for (int64_t d = 0; d < D; ++d) wrong = wrong || got[((b * Sq + row) * H + h) * D + d] != 0.f;
        if (c.with_lse) {
          const float g = lse_host[b * lbs + h * lhs + row * lrs];
          wrong = wrong || (c.sinks ? !(std::fabs(double(g) - sinks_host[h]) <= 1e-4) : g != -INFINITY);
        }
        empty_wrong += wrong;
      }
    }
  }
  // Nothing written outside out's and lse's views.
  const int64_t out_outside = out.written_outside_view(out_raw);
  int64_t lse_outside = 0;
  {
    std::vector<char> inside(lse_elems, 0);
    if (c.with_lse)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t r = 0; r < Sq; ++r) inside[b * lbs + h * lhs + r * lrs] = 1;
    for (int64_t i = 0; i < lse_elems; ++i) {
      uint32_t bits;
      memcpy(&bits, &lse_host[i], 4);
      lse_outside += !inside[i] && bits != 0xFFFFFFFFu;
    }
  }

  const double tol = tolerance(c.dtype);
  const bool ok = stats.nan_count == 0 && stats.rel_l2 <= tol && lse_err <= 1e-4 && empty_wrong == 0 &&
                  out_outside == 0 && lse_outside == 0 && append_wrong == 0 && other_changed == 0;
  printf("    %-100s rows %5zu relL2 %.2e lse %.1e empty %lld/%lld cache %lld/%lld  %s\n", describe(c).c_str(),
         check_rows.size(), stats.rel_l2, lse_err, (long long)empty_wrong, (long long)empty_rows,
         (long long)append_wrong, (long long)other_changed, ok ? "ok" : "FAIL");
  std::string worst;
  if (stats.worst_index >= 0 && !check_rows.empty()) {
    const Row& r = check_rows[stats.worst_index / D];
    char buf[200];
    snprintf(buf, sizeof buf, "worst at b=%d (len %lld) h=%lld row=%lld col=%lld: got %g want %g", r.b,
             (long long)len[r.b], (long long)r.h, (long long)r.row, (long long)(stats.worst_index % D),
             got_rows[stats.worst_index], want[stats.worst_index]);
    worst = buf;
  }
  CHECK(stats.nan_count == 0) << describe(c) << " NaN in output: " << stats.nan_count << " seed " << seed;
  CHECK(stats.rel_l2 <= tol) << describe(c) << " rel L2 " << stats.rel_l2 << " " << worst << " seed " << seed;
  CHECK(lse_err <= 1e-4) << describe(c) << " LSE error " << lse_err << " seed " << seed;
  CHECK(empty_wrong == 0) << describe(c) << " " << empty_wrong << " of " << empty_rows
                          << " rows without keys not out = 0, lse = -inf/sink, seed " << seed;
  CHECK(out_outside == 0) << describe(c) << " wrote " << out_outside << " elements outside out";
  CHECK(lse_outside == 0) << describe(c) << " wrote " << lse_outside << " values outside lse";
  CHECK(append_wrong == 0) << describe(c) << " " << append_wrong
                           << " elements of the appended rows not written as k/v, seed " << seed;
  CHECK(other_changed == 0) << describe(c) << " " << other_changed
                            << " cache elements changed that the append must not touch, seed " << seed;
  res.out = got;
  if (c.with_lse) {
    res.lse.resize(B * H * Sq);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t r = 0; r < Sq; ++r) res.lse[(b * H + h) * Sq + r] = lse_host[b * lbs + h * lhs + r * lrs];
  }
  return res;
}

void check_case(const Case& c) { run_case(c, gpu_test::fresh_seed()); }

// B cache lengths in [0, cap], 0 and cap among them (one of the two when B == 1).
std::vector<int> random_lengths(int B, int64_t cap, std::mt19937_64& rng) {
  std::vector<int> lens(B);
  for (int& l : lens) l = static_cast<int>(rng() % (cap + 1));
  if (B == 1) {
    const int64_t choice[3] = {0, cap, static_cast<int64_t>(rng() % (cap + 1))};
    lens[0] = static_cast<int>(choice[rng() % 3]);
  } else {
    lens[0] = 0, lens[1] = static_cast<int>(cap);
    if (B > 2) lens[2] = static_cast<int>(std::min<int64_t>(1, cap));
    std::shuffle(lens.begin(), lens.end(), rng);
  }
  return lens;
}

uint64_t parameter_seed() {
  const uint64_t seed = gpu_test::fresh_seed();
  printf("    parameters drawn from seed %llu\n", (unsigned long long)seed);
  return seed;
}

// ---- 1. Dense caches without an append: every Sq, causal and not, random GQA, batch, cache
// size and lengths.
void run_dense_matrix(DType dtype, int head_dim) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  for (bool causal : {false, true})
    for (int64_t sq : {1, 3, 17, 130}) {
      Case c;
      c.dtype = dtype, c.head_dim = head_dim, c.causal = causal, c.seqlen_q = sq;
      // GQA groups packed whole into a tile's rows (4 and 8), unpacked (1), and ones whose tile
      // is not filled (3: 42 positions x 3 heads = 126 rows) or holds few positions (16: 8)
      const int ratios[5] = {1, 4, 8, 3, 16};
      c.heads_kv = 1 + static_cast<int64_t>(rng() % 2);
      c.heads_q = c.heads_kv * ratios[rng() % 5];
      const int64_t sizes[4] = {37, 200, 513, 1024};
      c.s_cache = sizes[rng() % 4];
      c.cache_seqlens = random_lengths(1 + static_cast<int>(rng() % 5), c.s_cache, rng);
      c.padded = rng() % 3 == 0;
      c.with_lse = rng() % 4 != 0;
      check_case(c);
    }
}

// ---- 2. Paged caches: the page sizes, random tables, dtypes and head dims (a padded one).
struct PagedShape {
  DType dtype;
  int head_dim;
  bool causal;
  int64_t sq;
};

// Each shape over pages of page_size with about `keys` keys of capacity a sequence, random
// tables, GQA ratios and lengths.
template <size_t N>
void run_paged_shapes(int page_size, const PagedShape (&shapes)[N], int keys) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  for (const PagedShape& s : shapes) {
    Case c;
    c.dtype = s.dtype, c.head_dim = s.head_dim, c.causal = s.causal, c.seqlen_q = s.sq;
    c.page_size = page_size;
    c.max_pages = std::max(2, keys / page_size) + static_cast<int>(rng() % 3);
    c.spare_pages = 1 + static_cast<int>(rng() % 4);
    const int ratios[5] = {1, 4, 8, 3, 16};
    c.heads_kv = 1 + static_cast<int64_t>(rng() % 2);
    c.heads_q = c.heads_kv * ratios[rng() % 5];
    c.cache_seqlens = random_lengths(1 + static_cast<int>(rng() % 5), capacity(c), rng);
    c.padded = rng() % 2 == 0;
    c.with_lse = rng() % 4 != 0;
    check_case(c);
  }
}

// Each (query heads, KV heads) group at 1, 5 and 130 new rows, causal and sinks at random, the
// head dim from head_dim(rng): the GQA packing's rows against the reference.
template <size_t N, class HeadDim>
void run_gqa_packing(const int64_t (&groups)[N][2], HeadDim head_dim) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  for (const auto& g : groups)
    for (int64_t sq : {1, 5, 130}) {
      Case c;
      c.heads_q = g[0], c.heads_kv = g[1];
      c.seqlen_q = sq;
      c.causal = rng() % 2 == 0;
      c.sinks = rng() % 2 == 0;
      c.head_dim = head_dim(rng);
      c.dtype = rng() % 2 ? DType::f16 : DType::bf16;
      c.s_cache = 300;
      c.cache_seqlens = random_lengths(1 + static_cast<int>(rng() % 3), c.s_cache, rng);
      c.with_lse = true;
      check_case(c);
    }
}

// Each forced split count (1: no combine; past a tile's key tiles: empty pieces) on its own case:
// dense or paged (counts 3 mod 4), causal (odd), sinks (multiples of 3), new rows at 2, the head
// dim `dim` (at 33 splits `dim33`); one cache full so that every piece has keys.
template <size_t N>
void run_forced_splits(const int (&counts)[N], int dim, int dim33, std::mt19937_64& rng) {
  for (int splits : counts) {
    Case c;
    c.num_splits = splits;
    c.causal = splits % 2 == 1;
    c.sinks = splits % 3 == 0;
    c.seqlen_q = splits == 7 ? 20 : (splits == 5 ? 3 : 1);
    c.heads_q = 16, c.heads_kv = 4;
    c.head_dim = splits == 33 ? dim33 : dim;
    c.dtype = splits % 2 ? DType::bf16 : DType::f16;
    if (splits % 4 == 3) {
      c.page_size = 64, c.max_pages = 40;
    } else {
      c.s_cache = 2600;
    }
    c.cache_seqlens = random_lengths(1 + static_cast<int>(rng() % 4), capacity(c), rng);
    c.cache_seqlens[0] = static_cast<int>(capacity(c));  // one full cache: every piece has keys
    c.s_new = splits == 2 ? 1 : 0;
    c.with_lse = true;
    check_case(c);
  }
}

void run_paged(int page_size) {
  const PagedShape shapes[] = {{DType::bf16, 128, true, 1},
                               {DType::f16, 64, false, 17},
                               {DType::bf16, 256, true, 130},
                               {DType::f16, 80, true, 3},
                               {DType::bf16, 64, false, 1}};
  run_paged_shapes(page_size, shapes, 768);
}

// ---- 3. Appends (S_new 1 and 4), lengths that fill the capacity exactly and overflow it.
Case append_case(DType dtype, int head_dim, int64_t s_new, int64_t sq, bool causal, int page_size,
                 std::mt19937_64& rng) {
  Case c;
  c.dtype = dtype, c.head_dim = head_dim, c.causal = causal, c.seqlen_q = sq, c.s_new = s_new;
  c.heads_kv = 1 + static_cast<int64_t>(rng() % 2);
  c.heads_q = c.heads_kv * (rng() % 2 ? 4 : 1);
  if (page_size > 0) {
    c.page_size = page_size;
    c.max_pages = std::max(2, 512 / page_size) + static_cast<int>(rng() % 2);
  } else {
    const int64_t sizes[3] = {40, 300, 777};
    c.s_cache = sizes[rng() % 3];
  }
  const int cap = static_cast<int>(capacity(c));
  // Empty, one short of full, full, the append crossing the capacity, the append ending at it,
  // a page boundary (paged) or a random depth.
  // (The first two always kept: cap - 2 + 4 and cap + 1 cross the capacity.)
  c.cache_seqlens = {cap - 2, cap, 0, cap - 1, cap - static_cast<int>(s_new),
                     page_size > 0 ? page_size * (1 + static_cast<int>(rng() % 2)) - 1
                                   : static_cast<int>(rng() % (cap + 1))};
  std::shuffle(c.cache_seqlens.begin() + 2, c.cache_seqlens.end(), rng);
  c.cache_seqlens.resize(3 + rng() % 4);
  std::shuffle(c.cache_seqlens.begin(), c.cache_seqlens.end(), rng);
  c.padded = rng() % 2 == 0;
  return c;
}

}  // namespace

TEST(kvcache_dense_bf16_d64) { run_dense_matrix(DType::bf16, 64); }
TEST(kvcache_dense_bf16_d128) { run_dense_matrix(DType::bf16, 128); }
TEST(kvcache_dense_bf16_d256) { run_dense_matrix(DType::bf16, 256); }
TEST(kvcache_dense_bf16_d80) { run_dense_matrix(DType::bf16, 80); }
TEST(kvcache_dense_f16_d64) { run_dense_matrix(DType::f16, 64); }
TEST(kvcache_dense_f16_d128) { run_dense_matrix(DType::f16, 128); }
TEST(kvcache_dense_f16_d256) { run_dense_matrix(DType::f16, 256); }
TEST(kvcache_dense_f16_d80) { run_dense_matrix(DType::f16, 80); }

// ---- Head dim 512 and the padded dims 264..504 that run in its kernel (split_head_dim.cuh's
// consumer over KV caches: 64-row tiles of packed rows that both consumer warpgroups share, each
// half of the head dim; 64-key tiles of 8 panels; the split combine's CTAs from the state part
// that holds their columns, combine_slices.hpp). Not yet run on the H200 when written.
TEST(kvcache_dense_bf16_d512) { run_dense_matrix(DType::bf16, 512); }
TEST(kvcache_dense_f16_d512) { run_dense_matrix(DType::f16, 512); }
TEST(kvcache_dense_bf16_d384) { run_dense_matrix(DType::bf16, 384); }
TEST(kvcache_dense_f16_d264) { run_dense_matrix(DType::f16, 264); }

// Paged at 512: boxes of 1 key (64 a tile, four issuers), 16 (pages of 48), 64 (one a tile) from
// pages of 1, 48, 64 and 256; GQA ratios as the dense matrix's; a padded dim (384, 264).
static void run_paged_512(int page_size) {
  const PagedShape shapes[] = {{DType::bf16, 512, true, 1},
                               {DType::f16, 512, false, 17},
                               {DType::bf16, 384, true, 130},
                               {DType::f16, 264, false, 3}};
  run_paged_shapes(page_size, shapes, 600);
}
TEST(kvcache_d512_paged_ps1) { run_paged_512(1); }
TEST(kvcache_d512_paged_ps48) { run_paged_512(48); }
TEST(kvcache_d512_paged_ps64) { run_paged_512(64); }
TEST(kvcache_d512_paged_ps256) { run_paged_512(256); }

// Appends at 512 (a row is 64 pieces of 16 bytes: two a lane of append_kv's warp) and 264 (33),
// dense and paged, lengths at and across the capacity.
TEST(kvcache_d512_append) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  for (int64_t s_new : {1, 4}) {
    check_case(append_case(DType::bf16, 512, s_new, s_new, true, 0, rng));
    check_case(append_case(DType::f16, 264, s_new, s_new, true, 0, rng));
    check_case(append_case(DType::bf16, 512, s_new, 3, false, 0, rng));  // Sq != S_new, not causal
    for (int page_size : {1, 16, 64, 256}) {
      check_case(append_case(DType::bf16, 512, s_new, s_new, true, page_size, rng));
      check_case(append_case(DType::f16, page_size == 16 ? 264 : 384, s_new, 1, page_size != 64, page_size, rng));
    }
  }
}

// Split keys at 512: forced counts from 1 (no combine) to 128 (most pieces empty), dense and
// paged, causal and not, with sinks; each piece's two warpgroups leave their column halves.
TEST(kvcache_d512_forced_splits) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  const int splits[] = {1, 2, 3, 5, 7, 33, 128};
  run_forced_splits(splits, 512, 384, rng);
  // The default split choice on a decode shape (B x Hkv well under the SMs: split)
  for (int b : {1, 3}) {
    Case c;
    c.head_dim = 512;
    c.heads_q = 32, c.heads_kv = 8, c.seqlen_q = 1, c.s_cache = 4096;
    c.cache_seqlens = random_lengths(b, c.s_cache, rng);
    c.cache_seqlens[0] = 4096;
    check_case(c);
  }
}

// GQA packing into 64 rows (gqa_packing(group, 64)): unpacked (1), whole groups (4, 32, 64),
// groups not filling the tile (3: 21 positions x 3 heads = 63 rows), one position a tile (64
// heads on one KV head), a group larger than the tile (160 heads: chunks of 40); sinks per row's
// own head, causal positions over packed rows.
TEST(kvcache_d512_gqa_packing_shapes) {
  const int64_t groups[][2] = {{4, 4}, {8, 2}, {64, 2}, {6, 2}, {64, 1}, {160, 1}};
  run_gqa_packing(groups, [](std::mt19937_64& rng) { return rng() % 3 ? 512 : 384; });
}

// Windows and sinks at 512, dense and paged (the masks' packed rows: ConsumerTile's row0/row1
// with the shared rows).
TEST(kvcache_d512_window_and_sinks) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  struct Spec {
    int left, right;
    bool causal, sinks;
    int64_t sq;
  };
  const Spec specs[] = {{16, -1, false, false, 1}, {64, 0, true, false, 17}, {100, 7, false, true, 130},
                        {-1, -1, true, true, 3},   {5, -1, true, false, 130}};
  int i = 0;
  for (const Spec& s : specs) {
    Case c;
    c.dtype = i % 2 ? DType::f16 : DType::bf16;
    c.head_dim = i == 3 ? 264 : 512;
    c.window_left = s.left, c.window_right = s.right, c.causal = s.causal, c.sinks = s.sinks;
    c.seqlen_q = s.sq;
    c.heads_q = 8, c.heads_kv = i % 2 ? 1 : 8;
    c.s_cache = i % 2 ? 500 : 1024;
    c.cache_seqlens = random_lengths(1 + static_cast<int>(rng() % 5), c.s_cache, rng);
    if (c.cache_seqlens.size() == 1) c.cache_seqlens.push_back(0);  // a sequence without keys
    c.padded = i == 2;
    check_case(c);
    ++i;
  }
  Case c;
  c.head_dim = 512;
  c.page_size = 16, c.max_pages = 32;
  c.s_new = 4, c.seqlen_q = 4, c.causal = true, c.window_left = 40, c.window_right = 0, c.sinks = true;
  c.heads_q = 8, c.heads_kv = 2;
  c.cache_seqlens = random_lengths(4, capacity(c), rng);
  check_case(c);
}

// Pages of any size: one key (SGLang's), three (boxes of one row and pages that are not a power
// of two), eight (a box a swizzle atom) and 48 (boxes of 16, pages of three of them).
TEST(kvcache_paged_ps1) { run_paged(1); }
TEST(kvcache_paged_ps3) { run_paged(3); }
TEST(kvcache_paged_ps8) { run_paged(8); }
TEST(kvcache_paged_ps48) { run_paged(48); }
TEST(kvcache_paged_ps16) { run_paged(16); }
TEST(kvcache_paged_ps64) { run_paged(64); }
TEST(kvcache_paged_ps128) { run_paged(128); }
TEST(kvcache_paged_ps256) { run_paged(256); }

// No cache_seqlens: every cache full (its capacity), dense and paged.
TEST(kvcache_full_caches_without_seqlens) {
  REQUIRE_HOPPER();
  for (int page_size : {0, 16, 256})
    for (bool causal : {false, true}) {
      Case c;
      c.causal = causal, c.seqlen_q = causal ? 17 : 1;
      c.heads_q = 8, c.heads_kv = 1;
      if (page_size > 0)
        c.page_size = page_size, c.max_pages = 1024 / page_size - 1;
      else
        c.s_cache = 333;
      c.cache_seqlens.assign(3, 0);  // (the batch; not passed)
      c.pass_seqlens = false;
      check_case(c);
    }
}

// cache_seqlens outside [0, capacity] (negative, past the capacity, INT_MIN and INT_MAX) are
// clamped, with and without an append (INT_MAX + S_new must not wrap).
TEST(kvcache_seqlens_clamped) {
  REQUIRE_HOPPER();
  for (int page_size : {0, 64})
    for (int64_t s_new : {0, 2}) {
      Case c;
      c.causal = true, c.seqlen_q = 2, c.s_new = s_new;
      c.heads_q = 4, c.heads_kv = 2, c.head_dim = 64;
      if (page_size > 0)
        c.page_size = page_size, c.max_pages = 5;
      else
        c.s_cache = 300;
      const int cap = static_cast<int>(capacity(c));
      c.cache_seqlens = {-5, cap + 7, INT_MAX, INT_MIN, 3, cap - 1};
      check_case(c);
    }
}

TEST(kvcache_append_dense) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  for (int64_t s_new : {1, 4}) {
    check_case(append_case(DType::bf16, 128, s_new, s_new, true, 0, rng));
    check_case(append_case(DType::f16, 64, s_new, s_new, true, 0, rng));
    check_case(append_case(DType::bf16, 256, s_new, s_new, true, 0, rng));
    check_case(append_case(DType::f16, 80, s_new, s_new, true, 0, rng));
    check_case(append_case(DType::bf16, 128, s_new, 3, false, 0, rng));  // Sq != S_new, not causal
    check_case(append_case(DType::bf16, 64, s_new, 6, true, 0, rng));    // Sq > S_new
  }
}

TEST(kvcache_append_paged) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  for (int64_t s_new : {1, 4})
    for (int page_size : {1, 12, 16, 64, 128, 256}) {
      check_case(append_case(DType::bf16, 128, s_new, s_new, true, page_size, rng));
      check_case(append_case(page_size == 64 ? DType::f16 : DType::bf16, page_size == 16 ? 80 : 64, s_new, 1,
                             page_size != 128, page_size, rng));
    }
  // A small cache where every sequence's append crosses the capacity or ends at it.
  Case c;
  c.page_size = 16, c.max_pages = 2, c.s_new = 4, c.seqlen_q = 4, c.causal = true;
  c.heads_q = 4, c.heads_kv = 1;
  c.cache_seqlens = {29, 30, 31, 32, 28};
  check_case(c);
  c.page_size = 0, c.max_pages = 0, c.s_cache = 32;
  check_case(c);
}

// The same logical data in a dense cache of S_cache = max_pages x page_size and in a paged one:
// the same plan and the same key tiles, so the same bits.
TEST(kvcache_dense_and_paged_agree) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  for (int i = 0; i < 4; ++i) {
    const int page_sizes[4] = {16, 64, 128, 256};
    const int page_size = page_sizes[i];
    Case p;
    p.dtype = i % 2 ? DType::f16 : DType::bf16;
    p.head_dim = i == 2 ? 256 : (i == 3 ? 80 : 128);
    p.causal = i % 2 == 0;
    p.seqlen_q = i == 1 ? 130 : (i == 3 ? 4 : 1);
    p.s_new = i == 1 || i == 3 ? 4 : 0;
    p.heads_q = 8, p.heads_kv = 2;
    p.page_size = page_size, p.max_pages = std::max(2, 1024 / page_size) - 1;
    p.padded = i == 2;
    p.cache_seqlens = random_lengths(4, capacity(p), rng);
    Case d = p;
    d.page_size = 0, d.max_pages = 0, d.s_cache = capacity(p);
    const uint64_t seed = gpu_test::fresh_seed();
    const Outcome a = run_case(p, seed), b = run_case(d, seed);
    if (!a.ran || !b.ran) continue;
    int64_t differ = 0, lse_differ = 0;
    for (size_t e = 0; e < a.out.size(); ++e) differ += memcmp(&a.out[e], &b.out[e], 4) != 0;
    for (size_t e = 0; e < a.lse.size(); ++e) lse_differ += memcmp(&a.lse[e], &b.lse[e], 4) != 0;
    printf("    paged %d vs dense: %lld of %zu out elements and %lld of %zu lse values differ\n", page_size,
           (long long)differ, a.out.size(), (long long)lse_differ, a.lse.size());
    CHECK(differ == 0 && lse_differ == 0) << describe(p) << ": paged and dense calls differ in " << differ
                                          << " out elements and " << lse_differ << " lse values, seed " << seed;
  }
}

// Split keys (flash-decoding): every split count, forced, gives the reference's result within the
// bound, dense and paged, causal and not, with sinks and lse; counts past a tile's key tiles
// leave empty pieces (their partial states are -inf and drop out of the combine).
TEST(kvcache_forced_splits) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  const int splits[] = {1, 2, 3, 7, 33, 128};
  run_forced_splits(splits, 128, 256, rng);
}

// The default split choice on decode shapes few enough tiles to split (B x Hkv well under the
// SMs): the combine's result against the reference, and against the unsplit launch within the
// bound. Also a long cache in one sequence, with one and four positions, paged too (many
// splits of one tile).
TEST(kvcache_default_splits_on_decode_shapes) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  for (int b : {1, 3}) {
    Case c;
    c.heads_q = 32, c.heads_kv = 8, c.seqlen_q = 1, c.s_cache = 4096;
    c.cache_seqlens = random_lengths(b, c.s_cache, rng);
    c.cache_seqlens[0] = 4096;
    check_case(c);
  }
  for (int sq : {1, 4}) {
    for (int page_size : {0, 256}) {
      Case c;
      c.heads_q = 32, c.heads_kv = 8, c.seqlen_q = sq, c.s_cache = 16384;
      if (page_size > 0) c.page_size = page_size, c.max_pages = 16384 / page_size;
      c.cache_seqlens = {16384 - static_cast<int>(rng() % 300)};
      check_case(c);
    }
  }
}

// GQA packing (decode_plan.hpp, gqa_packing): a tile's rows are (position, query head) pairs
// of one KV head. Groups of every kind: unpacked (1), whole (4, 32), not filling the tile (3,
// 6 x 21 = 126 rows), whole groups of one position per tile (128), a group larger than the tile
// (160 query heads on one KV head: chunks of 80 heads, two per KV head), with sinks (a sink per
// row's own head) and causal positions spread over packed rows (Sq 5 and 130).
TEST(kvcache_gqa_packing_shapes) {
  const int64_t groups[][2] = {{12, 12}, {8, 2}, {64, 2}, {6, 2}, {12, 2}, {128, 1}, {160, 1}};
  run_gqa_packing(groups, [](std::mt19937_64& rng) { return rng() % 2 ? 64 : 128; });
}

// Table entries inside a sequence's used pages that name no page of the cache (-1): the keys
// and values there read as zeros (in the softmax), appends into them are dropped, nothing
// faults. (warpattn.hpp: "a page index outside [0, num_pages) is never read (its keys read as
// zeros) nor written"; this test takes "keys read as zeros" to include the values.)
TEST(kvcache_paged_invalid_page_inside_length) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Case c;
    c.causal = causal, c.seqlen_q = 4, c.s_new = 4;
    c.heads_q = 8, c.heads_kv = 2, c.head_dim = 128;
    c.page_size = 16, c.max_pages = 6;
    // Sequence 0 holds 46 keys and appends 46 .. 49: 46, 47 in its slot 2, 48, 49 in slot 3,
    // which is invalid (dropped, read as zeros). Sequence 1: slot 1 of its 40 keys invalid.
    c.cache_seqlens = {46, 40, 10};
    c.invalid_slots = {{0, 3}, {1, 1}};
    check_case(c);
  }
}

// Zero capacity (S_cache 0, or max_pages 0): every row out = 0, lse -inf or its sink; an
// append drops every row.
TEST(kvcache_zero_capacity) {
  REQUIRE_HOPPER();
  for (int page_size : {0, 16})
    for (bool sinks : {false, true}) {
      Case c;
      c.seqlen_q = 2, c.s_new = sinks ? 2 : 0, c.sinks = sinks, c.causal = !sinks;
      c.heads_q = 4, c.heads_kv = 2, c.head_dim = 64;
      c.padded = true;  // (a non-zero batch stride for the empty dense cache)
      if (page_size > 0) c.page_size = page_size, c.max_pages = 0;
      c.cache_seqlens = {0, 0, 5};
      check_case(c);
    }
}

// ---- 4. Sliding windows and sinks (dense; one paged case with an append).
TEST(kvcache_window_and_sinks) {
  REQUIRE_HOPPER();
  std::mt19937_64 rng(parameter_seed());
  struct Spec {
    int left, right;
    bool causal, sinks;
    int64_t sq;
  };
  const Spec specs[] = {{16, -1, false, false, 1}, {64, 0, true, false, 17}, {0, 0, false, false, 3},
                        {100, 7, false, true, 130}, {-1, 3, false, false, 17}, {-1, -1, true, true, 3},
                        {32, 0, true, true, 1},     {-1, -1, false, true, 1}, {5, -1, true, false, 130},
                        {200, 0, false, true, 17}};
  int i = 0;
  for (const Spec& s : specs) {
    Case c;
    c.dtype = i % 3 == 1 ? DType::f16 : DType::bf16;
    c.head_dim = i % 3 == 0 ? 128 : (i % 3 == 1 ? 64 : 256);
    c.window_left = s.left, c.window_right = s.right, c.causal = s.causal, c.sinks = s.sinks;
    c.seqlen_q = s.sq;
    c.heads_q = 8, c.heads_kv = i % 2 ? 1 : 8;
    c.s_cache = i % 2 ? 500 : 1024;
    c.cache_seqlens = random_lengths(1 + static_cast<int>(rng() % 5), c.s_cache, rng);
    if (c.cache_seqlens.size() == 1) c.cache_seqlens.push_back(0);  // a sequence without keys
    c.padded = i == 4;
    check_case(c);
    ++i;
  }
  for (int page_size : {16, 64}) {
    Case c;
    c.page_size = page_size, c.max_pages = 512 / page_size;
    c.s_new = 4, c.seqlen_q = 4, c.causal = true, c.window_left = 40, c.window_right = 0, c.sinks = true;
    c.heads_q = 8, c.heads_kv = 2;
    c.cache_seqlens = random_lengths(4, capacity(c), rng);
    check_case(c);
  }
}

// ---- 5. Invalid arguments: warpattn::Error before anything is launched or written.
TEST(kvcache_bad_arguments_write_nothing) {
  REQUIRE_HOPPER();
  const int64_t B = 2, Sq = 1, H = 4, Hkv = 1, D = 64, S = 64, Sn = 2;
  DeviceTensor q(DType::bf16, B, Sq, H, D, false), out(DType::bf16, B, Sq, H, D, false);
  DeviceTensor kc(DType::bf16, B, S, Hkv, D, false), vc(DType::bf16, B, S, Hkv, D, false);
  DeviceTensor pk(DType::bf16, 8, 16, Hkv, D, false), pv(DType::bf16, 8, 16, Hkv, D, false);   // pages of 16
  DeviceTensor p24k(DType::bf16, 8, 24, Hkv, D, false), p24v(DType::bf16, 8, 24, Hkv, D, false);  // pages of 24
  DeviceTensor p8k(DType::bf16, 8, 8, Hkv, D, false), p8v(DType::bf16, 8, 8, Hkv, D, false);    // pages of 8
  DeviceTensor kn(DType::bf16, B, Sn, Hkv, D, false), vn(DType::bf16, B, Sn, Hkv, D, false);
  DeviceTensor kn_heads(DType::bf16, B, Sn, 2, D, false);  // Hkv 2 against the caches' 1
  q.fill_normal(1), kc.fill_normal(2), vc.fill_normal(3), pk.fill_normal(4), pv.fill_normal(5);
  p24k.fill_normal(6), p24v.fill_normal(7), p8k.fill_normal(8), p8v.fill_normal(9);
  kn.fill_normal(10), vn.fill_normal(11), kn_heads.fill_normal(12);
  out.poison();
  gpu_test::DeviceBuffer lse_mem(B * H * Sq * 4);
  const warpattn::TensorView lse = gpu_test::contiguous(lse_mem.mem, DType::f32, {B, H, Sq});
  DeviceInts seqlens({10, 20}), seqlens3({10, 20, 30}), table_ints({0, 1, 2, 3, 4, 5, 6, 7});
  warpattn::TensorView table = table_ints.view;
  table.rank = 2, table.shape[0] = B, table.shape[1] = 4, table.stride[0] = 4, table.stride[1] = 1;
  warpattn::TensorView table_f32 = table;
  table_f32.dtype = DType::f32;
  CUDA_OK(cudaDeviceSynchronize());
  const auto snapshot = [&] {
    std::vector<std::vector<uint16_t>> s;
    for (DeviceTensor* t : {&kc, &vc, &pk, &pv, &p24k, &p24v, &p8k, &p8v}) s.push_back(t->raw());
    return s;
  };
  const auto caches_before = snapshot();

  warpattn::KvCache dense;
  dense.k_cache = kc.view, dense.v_cache = vc.view, dense.cache_seqlens = seqlens.view;
  dense.k = kn.view, dense.v = vn.view;
  warpattn::KvCache paged = dense;
  paged.k_cache = pk.view, paged.v_cache = pv.view, paged.block_table = table;
  const warpattn::ForwardOptions plain;
  // The valid calls these are made from pass validation (so each failure below is its own).
  for (const warpattn::KvCache* base : {&dense, &paged}) {
    bool valid = true;
    std::string what;
    try {
      warpattn::validate_forward_kvcache(q.view, *base, out.view, lse, plain);
    } catch (const std::exception& e) {
      valid = false, what = e.what();
    }
    CHECK(valid) << (base == &dense ? "dense" : "paged") << " base call refused: " << what;
  }

  struct Bad {
    const char* name;
    warpattn::KvCache cache;
    warpattn::ForwardOptions options;
  };
  std::vector<Bad> bad;
  {
    // Pages of any size from 1 are valid (pages of 24 and 8 were refused before pages-any).
    Bad b{"page_size 0", paged, plain};
    b.cache.k_cache = p8k.view, b.cache.v_cache = p8v.view;
    b.cache.k_cache.shape[1] = b.cache.v_cache.shape[1] = 0;
    bad.push_back(b);
  }
  {
    Bad b{"k pages of 24, v pages of 8", paged, plain};
    b.cache.k_cache = p24k.view, b.cache.v_cache = p8v.view;
    bad.push_back(b);
  }
  {
    Bad b{"k without v (dense)", dense, plain};
    b.cache.v.reset();
    bad.push_back(b);
  }
  {
    Bad b{"v without k (paged)", paged, plain};
    b.cache.k.reset();
    bad.push_back(b);
  }
  {
    Bad b{"append without cache_seqlens", dense, plain};
    b.cache.cache_seqlens.reset();
    bad.push_back(b);
  }
  {
    Bad b{"cache_seqlens of B + 1 entries", paged, plain};
    b.cache.cache_seqlens = seqlens3.view;
    bad.push_back(b);
  }
  {
    Bad b{"block_table of fp32", paged, plain};
    b.cache.block_table = table_f32;
    bad.push_back(b);
  }
  {
    Bad b{"new k with other heads than the cache", dense, plain};
    b.cache.k = kn_heads.view;
    bad.push_back(b);
  }
  {
    Bad b{"causal with window_right 2", dense, plain};
    b.options.causal = true, b.options.window_right = 2;
    bad.push_back(b);
  }
  {
    Bad b{"dense cache of another batch", dense, plain};
    b.cache.k_cache = pk.view, b.cache.v_cache = pv.view;  // (8, 16, ...) without a block table
    bad.push_back(b);
  }
  for (const Bad& b : bad) {
    bool threw_error = false, validate_threw = false;
    std::string what;
    try {
      warpattn::forward_kvcache(q.view, b.cache, out.view, lse, b.options);
    } catch (const warpattn::Error& e) {
      threw_error = true, what = e.what();
    } catch (const std::exception& e) {
      what = std::string("not a warpattn::Error: ") + e.what();
    }
    try {
      warpattn::validate_forward_kvcache(q.view, b.cache, out.view, lse, b.options);
    } catch (const warpattn::Error&) {
      validate_threw = true;
    } catch (const std::exception&) {
    }
    CUDA_OK(cudaDeviceSynchronize());
    const auto out_raw = out.raw();
    const auto lse_host = lse_mem.get<uint32_t>();
    int64_t written = 0;
    for (uint16_t x : out_raw) written += x != 0xFFFF;
    for (uint32_t x : lse_host) written += x != 0xFFFFFFFFu;
    const auto caches = snapshot();
    int64_t cache_changed = 0;
    for (size_t t = 0; t < caches.size(); ++t)
      for (size_t e = 0; e < caches[t].size(); ++e) cache_changed += caches[t][e] != caches_before[t][e];
    printf("    %-40s %s  %s\n", b.name, threw_error ? "Error:" : "no Error", what.c_str());
    CHECK(threw_error) << b.name << ": expected warpattn::Error, got " << (what.empty() ? "none" : what);
    CHECK(validate_threw) << b.name << ": validate_forward_kvcache did not throw warpattn::Error";
    CHECK(written == 0) << b.name << ": " << written << " out/lse elements written by a refused call";
    CHECK(cache_changed == 0) << b.name << ": " << cache_changed << " cache elements written by a refused call";
  }

  // The valid dense call does write (so the checks above could see a write).
  warpattn::forward_kvcache(q.view, dense, out.view, lse, plain);
  CUDA_OK(cudaDeviceSynchronize());
  int64_t nan_left = 0;
  for (float x : out.logical(out.raw())) nan_left += std::isnan(x);
  CHECK(nan_left == 0) << "the valid call left " << nan_left << " out elements NaN";
}

HARNESS_MAIN()

// ---- Issue 18: a decode step equals the prefill's last row, bitwise, in the batch-invariant
// mode with num_splits = 1, and with the mode's own split (num_splits = 0) where that leaves the
// cache in one piece (up to 2048 keys: invariant_chunk_keys). The KV-cache kernel and the dense one take the same tile
// widths, visit the same key tiles in the same order, and WGMMA keeps rows independent, so the row's online
// softmax and its P·V sums are the same operations on the same values; GQA packing only moves
// the row within its tile. Both causal (one new row sees every key either way; the causal
// kernels' tiles). A decode row takes the precise path where the prefill block holding it does
// (kvcache_sees_few_keys: the first block, whose first row sees one key), so 127, 128 and 129
// keys around the first block's end are cases too. From the cache as it is, and with the step's
// key and value appended to a cache of L - 1.
static void run_decode_equals_prefill_last_row(std::initializer_list<int> dims) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  const int64_t Hq = 8, Hkv = 2;
  for (int d : dims)
    for (int L : {1, 37, 127, 128, 129, 256, 300, 1000, 2047, 2048, 3001}) {
      // From 2048 rows d = 64's dense prefill takes the tall tiles (112 keys to the cache's 128).
      if (d == 64 && L >= 2048) continue;
      DeviceTensor q(DType::bf16, 1, L, Hq, d, false), k(DType::bf16, 1, L, Hkv, d, false),
          v(DType::bf16, 1, L, Hkv, d, false), out(DType::bf16, 1, L, Hq, d, false);
      q.fill_normal(seed + 3 * L + d), k.fill_normal(seed + 5 * L + d + 1), v.fill_normal(seed + 7 * L + d + 2);
      out.poison();
      float *lse_mem = nullptr, *lse1_mem = nullptr;
      CUDA_OK(cudaMalloc(&lse_mem, sizeof(float) * Hq * L));
      CUDA_OK(cudaMalloc(&lse1_mem, sizeof(float) * Hq));
      const warpattn::TensorView lse = gpu_test::contiguous(lse_mem, DType::f32, {1, Hq, L});
      const warpattn::TensorView lse1 = gpu_test::contiguous(lse1_mem, DType::f32, {1, Hq, 1});
      warpattn::ForwardOptions o;
      o.causal = true, o.batch_invariant = true;
      warpattn::forward(q.view, k.view, v.view, out.view, lse, o);

      // The step's query row, key and value: row L - 1 of q, k and v, as (1, 1, heads, d) views.
      const auto last_row = [L](const DeviceTensor& t) {
        warpattn::TensorView r = t.view;
        r.data = t.mem + (L - 1) * t.view.stride[1];
        r.shape[1] = 1;
        return r;
      };
      DeviceTensor kc(DType::bf16, 1, L, Hkv, d, false), vc(DType::bf16, 1, L, Hkv, d, false);
      CUDA_OK(cudaMemcpy(kc.mem, k.mem, k.alloc_elems * 2, cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaMemcpy(vc.mem, v.mem, v.alloc_elems * 2, cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> want_out = out.raw();
      std::vector<float> want_lse(Hq * L);
      CUDA_OK(cudaMemcpy(want_lse.data(), lse_mem, sizeof(float) * Hq * L, cudaMemcpyDeviceToHost));
      for (int splits : {1, 0})
      for (bool append : {false, true}) {
        if (splits == 0 && L > 2048) continue;  // the mode's 2048-key chunks: other bits, still the sequence's alone
        DeviceTensor out1(DType::bf16, 1, 1, Hq, d, false);
        out1.poison();
        CUDA_OK(cudaMemset(lse1_mem, 0xFF, sizeof(float) * Hq));
        DeviceInts lens({append ? L - 1 : L});
        warpattn::KvCache cache;
        cache.k_cache = kc.view, cache.v_cache = vc.view, cache.cache_seqlens = lens.view;
        cache.num_splits = splits;
        if (append) {
          // the cache's row L - 1 poisoned first: the append must bring it back
          CUDA_OK(cudaMemset(kc.mem + (L - 1) * kc.view.stride[1], 0xFF, Hkv * d * 2));
          CUDA_OK(cudaMemset(vc.mem + (L - 1) * vc.view.stride[1], 0xFF, Hkv * d * 2));
          cache.k = last_row(k), cache.v = last_row(v);
        }
        warpattn::forward_kvcache(last_row(q), cache, out1.view, lse1, o);
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint16_t> got = out1.raw();
        std::vector<float> got_lse(Hq);
        CUDA_OK(cudaMemcpy(got_lse.data(), lse1_mem, sizeof(float) * Hq, cudaMemcpyDeviceToHost));
        int64_t differ = 0, lse_differ = 0;
        for (int64_t h = 0; h < Hq; ++h) {
          for (int64_t e = 0; e < d; ++e)
            differ += got[h * out1.view.stride[2] + e] !=
                      want_out[(L - 1) * out.view.stride[1] + h * out.view.stride[2] + e];
          lse_differ += memcmp(&got_lse[h], &want_lse[h * L + L - 1], 4) != 0;
        }
        CHECK(differ == 0 && lse_differ == 0)
            << "d " << d << " L " << L << " num_splits " << splits << (append ? " (appended)" : "") << ": " << differ << " of " << Hq * d
            << " out elements and " << lse_differ << " of " << Hq << " lse values differ from the prefill's last row, seed "
            << seed;
      }
      cudaFree(lse_mem);
      cudaFree(lse1_mem);
    }
}
TEST(kvcache_decode_equals_prefill_last_row) { run_decode_equals_prefill_last_row({64, 128, 256}); }
// At 512 the prefill's 64-row blocks and the decode tile's kvcache_sees_few_keys(..., 64) agree.
TEST(kvcache_d512_decode_equals_prefill_last_row) { run_decode_equals_prefill_last_row({512}); }

// ---- Issue 18: in the batch-invariant mode a sequence's decode bits do not depend on the batch.
// The same sequence alone (its cache exactly its length, so its launch splits only as its own
// chunks need) and inside batches of other sequences of other lengths and a larger capacity (so
// the launch has more splits, most of them empty for this sequence), at a random position:
// out and lse bitwise equal. Lengths from one chunk (2048 keys: no split) to many (decode_plan's
// invariant_chunk_blocks), one new row, three and 16 (causal; 16 x the group of 4 is 64 rows a
// tile, whose chunks are 4096 keys: invariant_chunk_keys), every head dim; at 40000 keys 8 KV
// heads, so that a sequence's 8 tiles take at most 16 chunks each (invariant_max_chunks) and
// its 20 chunks of 2048 keys become 16 longer ones. The default mode's split count follows the
// batch's tiles, so its bits may move there (not asserted).
static void run_batch_invariant_alone_and_in_batches(std::initializer_list<int> dims) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t Hq = 8;
  for (int d : dims)
    for (int L : {700, 2048, 2049, 9001, 20000, 40000}) {
      const int64_t Hkv = L == 40000 ? 8 : 2;
      const int64_t Sq = L == 20000 ? 16 : L % 2 ? 3 : 1;
      const auto lse_view = [&](float* mem, int64_t b) { return gpu_test::contiguous(mem, DType::f32, {b, Hq, Sq}); };
      DeviceTensor q1(DType::bf16, 1, Sq, Hq, d, false), k1(DType::bf16, 1, L, Hkv, d, false),
          v1(DType::bf16, 1, L, Hkv, d, false), o1(DType::bf16, 1, Sq, Hq, d, false);
      q1.fill_normal(seed + 11 * L + d), k1.fill_normal(seed + 13 * L + d), v1.fill_normal(seed + 17 * L + d);
      o1.poison();
      float* lse1_mem = nullptr;
      CUDA_OK(cudaMalloc(&lse1_mem, sizeof(float) * Hq * Sq));
      CUDA_OK(cudaMemset(lse1_mem, 0xFF, sizeof(float) * Hq * Sq));
      warpattn::ForwardOptions o;
      o.causal = true, o.batch_invariant = true;
      DeviceInts len1({L});
      warpattn::KvCache c1;
      c1.k_cache = k1.view, c1.v_cache = v1.view, c1.cache_seqlens = len1.view;
      warpattn::forward_kvcache(q1.view, c1, o1.view, lse_view(lse1_mem, 1), o);
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> want = o1.raw();
      std::vector<float> want_lse(Hq * Sq);
      CUDA_OK(cudaMemcpy(want_lse.data(), lse1_mem, sizeof(float) * Hq * Sq, cudaMemcpyDeviceToHost));
      for (int B : {2, 5}) {
        const int64_t cap = L + 1 + static_cast<int64_t>(rng() % 30000);
        const int at = static_cast<int>(rng() % B);
        DeviceTensor qb(DType::bf16, B, Sq, Hq, d, false), kb(DType::bf16, B, cap, Hkv, d, false),
            vb(DType::bf16, B, cap, Hkv, d, false), ob(DType::bf16, B, Sq, Hq, d, false);
        qb.fill_normal(seed + 19 * B + d), kb.fill_normal(seed + 23 * B + d), vb.fill_normal(seed + 29 * B + d);
        ob.poison();
        // The sequence's rows into batch slot `at` (contiguous tensors: a slot is one block).
        CUDA_OK(cudaMemcpy(qb.mem + at * qb.view.stride[0], q1.mem, Sq * Hq * d * 2, cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaMemcpy(kb.mem + at * kb.view.stride[0], k1.mem, L * Hkv * d * 2, cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaMemcpy(vb.mem + at * vb.view.stride[0], v1.mem, L * Hkv * d * 2, cudaMemcpyDeviceToDevice));
        std::vector<int> lens(B);
        for (int b = 0; b < B; ++b) lens[b] = b == at ? L : static_cast<int>(rng() % (cap + 1));
        lens[(at + 1) % B] = static_cast<int>(cap);  // one full cache: the launch's largest split count
        DeviceInts lens_dev(lens);
        float* lse_mem = nullptr;
        CUDA_OK(cudaMalloc(&lse_mem, sizeof(float) * B * Hq * Sq));
        CUDA_OK(cudaMemset(lse_mem, 0xFF, sizeof(float) * B * Hq * Sq));
        warpattn::KvCache cb;
        cb.k_cache = kb.view, cb.v_cache = vb.view, cb.cache_seqlens = lens_dev.view;
        warpattn::forward_kvcache(qb.view, cb, ob.view, lse_view(lse_mem, B), o);
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint16_t> got = ob.raw();
        std::vector<float> got_lse(B * Hq * Sq);
        CUDA_OK(cudaMemcpy(got_lse.data(), lse_mem, sizeof(float) * B * Hq * Sq, cudaMemcpyDeviceToHost));
        int64_t differ = 0, lse_differ = 0;
        for (int64_t e = 0; e < Sq * Hq * d; ++e) differ += got[at * ob.view.stride[0] + e] != want[e];
        for (int64_t e = 0; e < Hq * Sq; ++e) lse_differ += memcmp(&got_lse[at * Hq * Sq + e], &want_lse[e], 4) != 0;
        CHECK(differ == 0 && lse_differ == 0)
            << "d " << d << " L " << L << " Sq " << Sq << ": inside a batch of " << B << " (position " << at
            << ", capacity " << cap << ") " << differ << " of " << Sq * Hq * d << " out elements and " << lse_differ
            << " lse values differ from the sequence alone, seed " << seed;
        cudaFree(lse_mem);
      }
      cudaFree(lse1_mem);
    }
}
TEST(kvcache_batch_invariant_alone_and_in_batches) { run_batch_invariant_alone_and_in_batches({64, 128, 256}); }
TEST(kvcache_d512_batch_invariant_alone_and_in_batches) { run_batch_invariant_alone_and_in_batches({512}); }
