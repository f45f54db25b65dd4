// warpattn::forward_kvcache over an E4M3 cache on the host (issue 16; warpattn.hpp,
// KvCache::k_descale; docs/decode-fp8-cache-design.md): its argument rules (validate_forward_kvcache,
// on the fake device addresses of kvcache_fixture.hpp, as test_kvcache.cpp) and what the validated
// call hands to dispatch.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "api/problem.hpp"
#include "expect_rejected.hpp"
#include "harness.hpp"
#include "kvcache_fixture.hpp"
#include "warpattn/warpattn.hpp"

namespace {

using namespace kvcache_fixture;

// The sizes of a call over an E4M3 cache; the defaults make a valid one: a decode step (one
// query row, one to append) over pages of 16 keys.
struct Spec : Sizes {
  Spec() { seqlen_q = 1, page_size = 16, s_new = 1; }
};

constexpr uintptr_t kKDescale = 0xa0000000, kVDescale = 0xb0000000;

// K as the 16-bit cache's, (pages, keys, heads_kv, head_dim), and V transposed in 16-key
// slices: (pages, heads_kv, keys / 16, 16 head_dim), in E4M3, with a descale per KV head for each.
Call make_call(const Spec& s = {}) {
  Call c = call_without_caches(s, /*with_lse=*/true, /*with_seqlens=*/true);
  const int64_t pages = s.paged ? s.num_pages : s.batch, keys = s.paged ? s.page_size : s.s_cache;
  c.cache.k_cache = view(kKCache, DType::e4m3, {pages, keys, s.heads_kv, s.head_dim});
  c.cache.v_cache = view(kVCache, DType::e4m3, {pages, s.heads_kv, keys / 16, 16 * s.head_dim});  // Vᵀ
  if (s.paged) c.cache.block_table = view(kTable, DType::s32, {s.batch, s.max_pages});
  c.cache.k_descale = view(kKDescale, DType::f32, {s.heads_kv});
  c.cache.v_descale = view(kVDescale, DType::f32, {s.heads_kv});
  return c;
}
Call make_paged(Spec s = {}) {
  s.paged = true;
  return make_call(s);
}

}  // namespace

TEST(kvcache_fp8_valid_calls) {
  EXPECT_ACCEPTED(make_call(), "dense");
  EXPECT_ACCEPTED(make_paged(), "paged, pages of 16");
  for (int64_t page : {32, 48, 64, 128, 256, 272}) {
    Spec s;
    s.page_size = page;
    EXPECT_ACCEPTED(make_paged(s), "page " << page);
  }
  for (int64_t d : {64, 128, 256}) {
    Spec s;
    s.head_dim = d;
    EXPECT_ACCEPTED(make_call(s), "d " << d);
    EXPECT_ACCEPTED(make_paged(s), "paged d " << d);
  }
  Spec f16;
  f16.dtype = DType::f16;
  EXPECT_ACCEPTED(make_call(f16), "fp16 q and out");
  Spec chunked;
  chunked.seqlen_q = 300, chunked.s_new = 300;
  EXPECT_ACCEPTED(make_call(chunked), "chunked prefill");
  Spec no_append;
  no_append.s_new = 0;
  EXPECT_ACCEPTED(make_call(no_append), "no append");
  Call shared = make_call();  // one descale for every head (vLLM's per-layer scale)
  shared.cache.k_descale->stride[0] = 0;
  shared.cache.v_descale->stride[0] = 0;
  EXPECT_ACCEPTED(shared, "zero descale stride");
  Call causal = make_call();
  causal.options.causal = true;
  causal.options.window_left = 100;
  EXPECT_ACCEPTED(causal, "causal with a window");
}

TEST(kvcache_fp8_call_sizes) {
  const warpattn::detail::KvCacheCall dense = validated(make_call());
  CHECK(dense.fp8);
  CHECK(dense.problem.seqlen_k == 512) << dense.problem.seqlen_k;
  CHECK(dense.problem.heads_kv == 2 && dense.problem.head_dim == 128);
  CHECK(dense.problem.dtype == DType::bf16);
  CHECK(dense.pages.table == nullptr && dense.pages.num_pages == 3);
  const warpattn::detail::KvCacheCall paged = validated(make_paged());
  CHECK(paged.fp8);
  CHECK(paged.work.capacity == 160) << paged.work.capacity;
  CHECK(paged.pages.page_size == 16 && paged.pages.num_pages == 40);
  Spec s;
  s.dtype = DType::f16;
  const warpattn::detail::KvCacheCall f16 = validated(make_call(s));
  CHECK(f16.fp8 && f16.problem.dtype == DType::f16);
}

TEST(kvcache_fp8_descales) {
  Call c = make_call();
  c.cache.v_descale.reset();
  EXPECT_REJECTED(c, "v_descale", "needs both k_descale and v_descale", "got one");
  c = make_call();
  c.cache.k_descale.reset();
  EXPECT_REJECTED(c, "k_descale", "needs both");
  c = make_call();
  c.cache.k_descale->dtype = DType::f16;
  EXPECT_REJECTED(c, "k_descale", "expected dtype float32");
  c = make_call();
  c.cache.v_descale = view(kVDescale, DType::f32, {3});
  EXPECT_REJECTED(c, "v_descale", "expected shape (2)", "one descale per KV head", "got (3)");
  c = make_call();
  c.cache.k_descale = view(kKDescale, DType::f32, {1, 2});
  EXPECT_REJECTED(c, "k_descale", "expected rank 1");
  c = make_call();
  c.cache.k_descale->stride[0] = -1;
  EXPECT_REJECTED(c, "k_descale", "must not be negative");
  c = make_call();
  c.cache.v_descale->data = fake(kVDescale + 2);
  EXPECT_REJECTED(c, "v_descale", "4-byte aligned");
  // Descales with 16-bit caches: the call is an E4M3 cache's, whose caches must be e4m3.
  c = make_call();
  c.cache.k_cache.dtype = DType::bf16;
  c.cache.v_cache.dtype = DType::bf16;
  EXPECT_REJECTED(c, "k_cache", "expected dtype float8_e4m3fn", "got bfloat16");
  // E4M3 caches without descales.
  c = make_call();
  c.cache.k_descale.reset();
  c.cache.v_descale.reset();
  EXPECT_REJECTED(c, "k_descale", "needs both", "got neither");
  // Overlap: a descale inside out.
  c = make_call();
  c.cache.k_descale->data = fake(kOut + 64);
  CHECK(error_of(c).has_value()) << "a descale overlapping out was accepted";
}

TEST(kvcache_fp8_cache_tensors) {
  Call c = make_call();
  c.cache.v_cache.dtype = DType::bf16;
  EXPECT_REJECTED(c, "v_cache", "expected dtype float8_e4m3fn");
  // V not transposed (the 16-bit cache's layout).
  c = make_call();
  c.cache.v_cache = view(kVCache, DType::e4m3, {3, 512, 2, 128});
  EXPECT_REJECTED(c, "v_cache", "expected shape (3, 2, 32, 2048)", "V transposed in 16-key slices",
                  "got (3, 512, 2, 128)");
  // V transposed without the slices (the layout before run 190).
  c = make_call();
  c.cache.v_cache = view(kVCache, DType::e4m3, {3, 2, 128, 512});
  EXPECT_REJECTED(c, "v_cache", "expected shape (3, 2, 32, 2048)", "got (3, 2, 128, 512)");
  c = make_paged();
  c.cache.v_cache = view(kVCache, DType::e4m3, {40, 2, 2, 2048});
  EXPECT_REJECTED(c, "v_cache", "expected shape (40, 2, 1, 2048)", "num_pages, heads, page_size / 16, 16 x head_dim");
  c = make_paged();
  c.cache.v_cache = view(kVCache, DType::e4m3, {39, 2, 1, 2048});
  EXPECT_REJECTED(c, "v_cache", "expected shape (40, 2, 1, 2048)");
  // Keys of a page (the dense cache's S_cache) a multiple of 16.
  Spec s;
  s.page_size = 24;
  EXPECT_REJECTED(make_paged(s), "k_cache", "page_size (shape[1]) must be a multiple of 16", "got 24");
  s.page_size = 8;
  EXPECT_REJECTED(make_paged(s), "k_cache", "multiple of 16", "got 8");
  Spec d;
  d.s_cache = 100;
  EXPECT_REJECTED(make_call(d), "k_cache", "seqlen (shape[1]) must be a multiple of 16", "got 100");
  // Head dims with a kernel: 64, 128 and 256.
  for (int64_t dim : {512, 96, 80}) {
    Spec h;
    h.head_dim = dim;
    EXPECT_REJECTED(make_call(h), "q", "must be one of 64, 128, 256 for an E4M3 KV cache");
  }
  // A slice's bytes contiguous, TMA strides.
  c = make_call();
  c.cache.v_cache.stride[3] = 2;
  EXPECT_REJECTED(c, "v_cache", "last dimension (16 x head_dim) must be contiguous");
  c = make_paged();
  c.cache.v_cache.stride[2] = 2056;  // a slice 2056 bytes after the last
  EXPECT_REJECTED(c, "v_cache", "multiple of 16 bytes");
  c = make_call();
  c.cache.k_cache = view(kKCache, DType::e4m3, {3, 512, 2, 64});
  EXPECT_REJECTED(c, "k_cache", "expected shape (3, 512, 2, 128)");
  c = make_call();
  c.cache.k_cache = view(kKCache, DType::e4m3, {3, 512, 3, 128});
  c.cache.v_cache = view(kVCache, DType::e4m3, {3, 3, 32, 2048});
  c.cache.k_descale = view(kKDescale, DType::f32, {3});
  c.cache.v_descale = view(kVDescale, DType::f32, {3});
  EXPECT_REJECTED(c, "k_cache", "query heads (8) must be a multiple of key/value heads (3)");
}

TEST(kvcache_fp8_q_out_and_new_rows) {
  // Each rule: the argument its refusal names, a phrase of that refusal, and the change that
  // breaks the rule, made to a fresh default call (so that the call breaks that rule alone).
  struct Rule {
    const char* argument;
    const char* phrase;
    void (*change)(Call&);
  };
  const Rule rules[] = {
      {"q", "expected dtype float16 or bfloat16", [](Call& c) { c.q.dtype = DType::e4m3; }},
      {"out", "expected dtype bfloat16 (same as q)", [](Call& c) { c.out.dtype = DType::f16; }},
      {"k", "expected dtype bfloat16 (same as q)", [](Call& c) { c.cache.k->dtype = DType::e4m3; }},
      {"v", "head_dim", [](Call& c) { c.cache.v = view(kVNew, DType::bf16, {3, 1, 2, 64}); }},
      {"v", "expected shape (3, 1, 2, 128)", [](Call& c) { c.cache.v = view(kVNew, DType::bf16, {3, 1, 4, 128}); }},
      {"lse", "expected shape (batch, heads_q, seqlen_q) = (3, 8, 1)",
       [](Call& c) { c.lse = view(kLse, DType::f32, {3, 1, 8}); }},
      {"options.softcap", "no softcap", [](Call& c) { c.options.softcap = 30.f; }},
      {"cache_seqlens", "needed to append k and v", [](Call& c) { c.cache.cache_seqlens.reset(); }},
  };
  for (const Rule& r : rules) {
    Call c = make_call();
    r.change(c);
    expect_rejected(c, r.argument, {r.phrase}, __LINE__);
  }
}
