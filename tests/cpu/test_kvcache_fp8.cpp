// warpattn::forward_kvcache over an E4M3 cache on the host (issue 16; warpattn.hpp,
// KvCache::k_descale; docs/decode-fp8-cache-design.md): its argument rules (validate_forward_kvcache,
// fake device addresses as test_kvcache.cpp) and what the validated call hands to dispatch.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "api/problem.hpp"
#include "expect_rejected.hpp"
#include "harness.hpp"
#include "warpattn/warpattn.hpp"

namespace {

using warpattn::DType;
using warpattn::TensorView;

TensorView view(uintptr_t address, DType dtype, std::initializer_list<int64_t> shape) {
  int64_t s[4] = {0, 0, 0, 0};
  int rank = 0;
  for (int64_t x : shape) s[rank++] = x;
  return warpattn::make_contiguous_view(reinterpret_cast<void*>(address), dtype, rank, s);
}

// The sizes of a call over an E4M3 cache; the defaults make a valid one.
struct Spec {
  bool paged = false;
  int64_t batch = 3, seqlen_q = 1, heads_q = 8, heads_kv = 2, head_dim = 128;
  int64_t s_cache = 512;                                   // dense
  int64_t num_pages = 40, page_size = 16, max_pages = 10;  // paged
  int64_t s_new = 1;                                       // 0: no append
  DType dtype = DType::bf16;
};

struct Call {
  TensorView q, out;
  std::optional<TensorView> lse;
  warpattn::KvCache cache;
  warpattn::ForwardOptions options;
};

constexpr uintptr_t kQ = 0x10000000, kOut = 0x20000000, kLse = 0x30000000, kKCache = 0x40000000,
                    kVCache = 0x50000000, kKNew = 0x60000000, kVNew = 0x70000000, kSeqlens = 0x80000000,
                    kTable = 0x90000000, kKDescale = 0xa0000000, kVDescale = 0xb0000000;

Call make_call(const Spec& s = {}) {
  Call c;
  c.q = view(kQ, s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
  c.out = view(kOut, s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
  c.lse = view(kLse, DType::f32, {s.batch, s.heads_q, s.seqlen_q});
  const int64_t pages = s.paged ? s.num_pages : s.batch, keys = s.paged ? s.page_size : s.s_cache;
  c.cache.k_cache = view(kKCache, DType::e4m3, {pages, keys, s.heads_kv, s.head_dim});
  c.cache.v_cache = view(kVCache, DType::e4m3, {pages, s.heads_kv, s.head_dim, keys});  // Vᵀ
  if (s.paged) c.cache.block_table = view(kTable, DType::s32, {s.batch, s.max_pages});
  c.cache.k_descale = view(kKDescale, DType::f32, {s.heads_kv});
  c.cache.v_descale = view(kVDescale, DType::f32, {s.heads_kv});
  c.cache.cache_seqlens = view(kSeqlens, DType::s32, {s.batch});
  if (s.s_new > 0) {
    c.cache.k = view(kKNew, s.dtype, {s.batch, s.s_new, s.heads_kv, s.head_dim});
    c.cache.v = view(kVNew, s.dtype, {s.batch, s.s_new, s.heads_kv, s.head_dim});
  }
  return c;
}
Call make_paged(Spec s = {}) {
  s.paged = true;
  return make_call(s);
}

std::optional<std::string> error_of(const Call& c) {
  try {
    warpattn::validate_forward_kvcache(c.q, c.cache, c.out, c.lse, c.options);
  } catch (const warpattn::Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

#define EXPECT_ACCEPTED(call, what) \
  CHECK(!error_of(call)) << "line " << __LINE__ << " (" << what << "): " << error_of(call).value_or("")

}  // namespace

TEST(kvcache_fp8_valid_calls) {
  EXPECT_ACCEPTED(make_call(), "dense");
  EXPECT_ACCEPTED(make_paged(), "paged, pages of 16");
  for (int64_t page : {32, 48, 64, 128, 256, 272}) {
    Spec s;
    s.page_size = page;
    EXPECT_ACCEPTED(make_paged(s), "page " << page);
  }
  for (int64_t d : {64, 128}) {
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
  const warpattn::detail::KvCacheCall dense =
      warpattn::detail::validate_forward_kvcache(make_call().q, make_call().cache, make_call().out, make_call().lse, {});
  CHECK(dense.fp8);
  CHECK(dense.problem.seqlen_k == 512) << dense.problem.seqlen_k;
  CHECK(dense.problem.heads_kv == 2 && dense.problem.head_dim == 128);
  CHECK(dense.problem.dtype == DType::bf16);
  CHECK(dense.pages.table == nullptr && dense.pages.num_pages == 3);
  const Call p = make_paged();
  const warpattn::detail::KvCacheCall paged = warpattn::detail::validate_forward_kvcache(p.q, p.cache, p.out, p.lse, {});
  CHECK(paged.fp8);
  CHECK(paged.work.capacity == 160) << paged.work.capacity;
  CHECK(paged.pages.page_size == 16 && paged.pages.num_pages == 40);
  Spec s;
  s.dtype = DType::f16;
  const Call c16 = make_call(s);
  const warpattn::detail::KvCacheCall f16 = warpattn::detail::validate_forward_kvcache(c16.q, c16.cache, c16.out, c16.lse, {});
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
  c.cache.v_descale->data = reinterpret_cast<void*>(kVDescale + 2);
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
  c.cache.k_descale->data = reinterpret_cast<void*>(kOut + 64);
  CHECK(error_of(c).has_value()) << "a descale overlapping out was accepted";
}

TEST(kvcache_fp8_cache_tensors) {
  Call c = make_call();
  c.cache.v_cache.dtype = DType::bf16;
  EXPECT_REJECTED(c, "v_cache", "expected dtype float8_e4m3fn");
  // V not transposed (the 16-bit cache's layout).
  c = make_call();
  c.cache.v_cache = view(kVCache, DType::e4m3, {3, 512, 2, 128});
  EXPECT_REJECTED(c, "v_cache", "expected shape (3, 2, 128, 512)", "V transposed", "got (3, 512, 2, 128)");
  c = make_paged();
  c.cache.v_cache = view(kVCache, DType::e4m3, {40, 2, 128, 32});
  EXPECT_REJECTED(c, "v_cache", "expected shape (40, 2, 128, 16)", "num_pages, heads, head_dim, page_size");
  c = make_paged();
  c.cache.v_cache = view(kVCache, DType::e4m3, {39, 2, 128, 16});
  EXPECT_REJECTED(c, "v_cache", "expected shape (40, 2, 128, 16)");
  // Keys of a page (the dense cache's S_cache) a multiple of 16.
  Spec s;
  s.page_size = 24;
  EXPECT_REJECTED(make_paged(s), "k_cache", "page_size (shape[1]) must be a multiple of 16", "got 24");
  s.page_size = 8;
  EXPECT_REJECTED(make_paged(s), "k_cache", "multiple of 16", "got 8");
  Spec d;
  d.s_cache = 100;
  EXPECT_REJECTED(make_call(d), "k_cache", "seqlen (shape[1]) must be a multiple of 16", "got 100");
  // Head dims with a kernel: 64 and 128.
  for (int64_t dim : {256, 96, 80}) {
    Spec h;
    h.head_dim = dim;
    EXPECT_REJECTED(make_call(h), "q", "must be one of 64, 128 for an E4M3 KV cache");
  }
  // Vᵀ's keys contiguous, TMA strides.
  c = make_call();
  c.cache.v_cache.stride[3] = 2;
  EXPECT_REJECTED(c, "v_cache", "last dimension (seqlen) must be contiguous");
  c = make_paged();
  c.cache.v_cache.stride[2] = 24;  // a head-dim row 24 bytes after the last
  EXPECT_REJECTED(c, "v_cache", "multiple of 16 bytes");
  c = make_call();
  c.cache.k_cache = view(kKCache, DType::e4m3, {3, 512, 2, 64});
  EXPECT_REJECTED(c, "k_cache", "expected shape (3, 512, 2, 128)");
  c = make_call();
  c.cache.k_cache = view(kKCache, DType::e4m3, {3, 512, 3, 128});
  c.cache.v_cache = view(kVCache, DType::e4m3, {3, 3, 128, 512});
  c.cache.k_descale = view(kKDescale, DType::f32, {3});
  c.cache.v_descale = view(kVDescale, DType::f32, {3});
  EXPECT_REJECTED(c, "k_cache", "query heads (8) must be a multiple of key/value heads (3)");
}

TEST(kvcache_fp8_q_out_and_new_rows) {
  Call c = make_call();
  c.q.dtype = DType::e4m3;
  EXPECT_REJECTED(c, "q", "expected dtype float16 or bfloat16");
  c = make_call();
  c.out.dtype = DType::f16;
  EXPECT_REJECTED(c, "out", "expected dtype bfloat16 (same as q)");
  c = make_call();
  c.cache.k->dtype = DType::e4m3;
  EXPECT_REJECTED(c, "k", "expected dtype bfloat16 (same as q)");
  c = make_call();
  c.cache.v = view(kVNew, DType::bf16, {3, 1, 2, 64});
  EXPECT_REJECTED(c, "v", "head_dim");
  c = make_call();
  c.cache.v = view(kVNew, DType::bf16, {3, 1, 4, 128});
  EXPECT_REJECTED(c, "v", "expected shape (3, 1, 2, 128)");
  c = make_call();
  c.lse = view(kLse, DType::f32, {3, 1, 8});
  EXPECT_REJECTED(c, "lse", "expected shape (batch, heads_q, seqlen_q) = (3, 8, 1)");
  c = make_call();
  c.options.softcap = 30.f;
  EXPECT_REJECTED(c, "options.softcap", "no softcap");
  c = make_call();
  c.cache.cache_seqlens.reset();
  EXPECT_REJECTED(c, "cache_seqlens", "needed to append k and v");
}
