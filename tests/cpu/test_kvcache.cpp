// warpattn::forward_kvcache on the host (issue 16; warpattn.hpp, KvCache): its argument rules
// (validate_forward_kvcache, on the fake device addresses of kvcache_fixture.hpp), what the
// validated call hands to dispatch (api/problem.hpp, KvCacheCall), where a cached key is
// loaded from (hopper/decode/kv_pages.hpp, cache_box and cache_box_rows, against the layout's
// definition), the sequences' lengths and the launch's pieces of work (hopper/decode/
// decode_plan.hpp and kv_cache_pieces.hpp: kv_cache_keys, kv_cache_piece).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "api/problem.hpp"
#include "expect_rejected.hpp"
#include "harness.hpp"
#include "hopper/decode/kv_pages.hpp"
#include "hopper/decode/kv_cache_pieces.hpp"
#include "kvcache_fixture.hpp"
#include "warpattn/warpattn.hpp"

namespace {

using namespace kvcache_fixture;

// The sizes of a call, and whether it gives the lengths and lse; the defaults make a valid one.
struct Spec : Sizes {
  bool seqlens = true, lse = true;
};

constexpr uintptr_t kSinks = 0xa0000000;  // the sinks' logits, apart from the fixture's tensors

// K and V cached alike: (batch, s_cache) or (num_pages, page_size) by (heads_kv, head_dim).
Call make_call(const Spec& s = {}) {
  Call c = call_without_caches(s, s.lse, s.seqlens);
  if (s.paged) {
    c.cache.k_cache = view(kKCache, s.dtype, {s.num_pages, s.page_size, s.heads_kv, s.head_dim});
    c.cache.v_cache = view(kVCache, s.dtype, {s.num_pages, s.page_size, s.heads_kv, s.head_dim});
    c.cache.block_table = view(kTable, DType::s32, {s.batch, s.max_pages});
  } else {
    c.cache.k_cache = view(kKCache, s.dtype, {s.batch, s.s_cache, s.heads_kv, s.head_dim});
    c.cache.v_cache = view(kVCache, s.dtype, {s.batch, s.s_cache, s.heads_kv, s.head_dim});
  }
  return c;
}

Call make_paged(Spec s = {}) {
  s.paged = true;
  return make_call(s);
}

}  // namespace

// ---- 1. valid calls and what validation hands to dispatch

TEST(kvcache_valid_calls) {
  for (bool paged : {false, true})
    for (bool seqlens : {false, true})
      for (int64_t s_new : {0, 1, 5})
        for (bool lse : {false, true}) {
          if (s_new > 0 && !seqlens) continue;  // appending needs the lengths
          Spec s;
          s.paged = paged, s.seqlens = seqlens, s.s_new = s_new, s.lse = lse;
          const Call c = make_call(s);
          EXPECT_ACCEPTED(c, "paged " << paged << " seqlens " << seqlens << " s_new " << s_new << " lse " << lse);
        }
  // GQA ratios (MQA included, and MHA), float16, head dims compiled and padded
  for (int64_t hkv : {1, 2, 4, 8})
    for (int64_t d : {64, 128, 256, 72, 8, 200, 264, 384, 504, 512})
      for (bool paged : {false, true})
        for (DType dt : {DType::bf16, DType::f16}) {
          Spec s;
          s.paged = paged, s.heads_kv = hkv, s.head_dim = d, s.dtype = dt;
          const Call c = make_call(s);
          EXPECT_ACCEPTED(c, "hkv " << hkv << " d " << d << " paged " << paged);
        }
  // Page sizes: any from 1 (SGLang's 1, vLLM's 16, FlashAttention's 256, and sizes that are not
  // powers of two)
  for (int64_t ps : {1, 2, 3, 8, 12, 16, 24, 32, 48, 64, 100, 128, 256, 512, 1024}) {
    Spec s;
    s.page_size = ps;
    const Call c = make_paged(s);
    EXPECT_ACCEPTED(c, "page_size " << ps);
  }
  // Options: causal, sliding windows, softcap, sinks, a scale, batch-invariant
  for (bool paged : {false, true}) {
    Spec s;
    s.paged = paged;
    Call c = make_call(s);
    c.options.causal = true;
    EXPECT_ACCEPTED(c, "causal");
    c.options.window_left = 100, c.options.window_right = 0;
    EXPECT_ACCEPTED(c, "causal + window");
    c.options.causal = false, c.options.window_left = 16, c.options.window_right = 16;
    EXPECT_ACCEPTED(c, "window");
    c.options.softcap = 30.f, c.options.softmax_scale = 0.1f, c.options.batch_invariant = true;
    EXPECT_ACCEPTED(c, "softcap, scale, batch_invariant");
    c.options.sinks = view(kSinks, DType::f32, {8});
    EXPECT_ACCEPTED(c, "sinks");
  }
  // Without the append, the caches may overlap q and each other (nothing writes them)
  {
    Spec s;
    s.s_new = 0;
    Call c = make_call(s);
    c.cache.v_cache.data = c.cache.k_cache.data;
    EXPECT_ACCEPTED(c, "k_cache == v_cache, read only");
    c.cache.k_cache.data = fake(kQ);
    EXPECT_ACCEPTED(c, "k_cache over q, read only");
  }
  // A block table whose rows are padded (last dimension contiguous)
  {
    Call c = make_paged();
    c.cache.block_table->stride[0] = 16;
    EXPECT_ACCEPTED(c, "padded table rows");
  }
  // Empty calls: no sequence, no query row, no key
  for (bool paged : {false, true}) {
    Spec s;
    s.paged = paged, s.batch = 0;
    EXPECT_ACCEPTED(make_call(s), "batch 0");
    s.batch = 3, s.seqlen_q = 0;
    EXPECT_ACCEPTED(make_call(s), "seqlen_q 0");
    s.seqlen_q = 4, s.s_cache = 0, s.max_pages = 0;
    EXPECT_ACCEPTED(make_call(s), "capacity 0");
  }
  // forward_kvcache itself returns at once when there is nothing to compute (no GPU needed)
  {
    Spec s;
    s.batch = 0;
    const Call c = make_call(s);
    try {
      warpattn::forward_kvcache(c.q, c.cache, c.out, c.lse, c.options);
    } catch (const warpattn::Error& e) {
      CHECK(false) << e.what();
    }
  }
}

TEST(kvcache_call_sizes_dense) {
  Spec s;  // B 3, Sq 4, Hq 8, Hkv 2, D 128, S_cache 512, S_new 2
  const Call c = make_call(s);
  REQUIRE(!error_of(c)) << *error_of(c);
  const warpattn::detail::KvCacheCall k = validated(c);
  const warpattn::detail::ForwardProblem& p = k.problem;
  CHECK(p.batch == 3 && p.seqlen_q == 4 && p.seqlen_k == 512) << p.batch << " " << p.seqlen_q << " " << p.seqlen_k;
  CHECK(p.heads_q == 8 && p.heads_kv == 2 && p.head_dim == 128 && p.value_head_dim() == 128);
  CHECK(p.dtype == DType::bf16 && p.has_lse && !p.causal);
  CHECK(k.pages.table == nullptr) << "dense";
  CHECK(k.pages.num_pages == 3) << "dense: a page per sequence, got " << k.pages.num_pages;
  CHECK(k.appended == 2) << k.appended;
  CHECK(k.work.cache_seqlens == static_cast<const int*>(fake(kSeqlens)));
  CHECK(k.work.capacity == 512 && k.work.appended == 2) << k.work.capacity << " " << k.work.appended;

  // No append, no lengths: every cache is full
  s.s_new = 0, s.seqlens = false, s.lse = false;
  const warpattn::detail::KvCacheCall full = validated(make_call(s));
  CHECK(full.appended == 0 && full.work.appended == 0 && full.work.cache_seqlens == nullptr);
  CHECK(!full.problem.has_lse);
  CHECK(full.work.capacity == 512 && full.problem.seqlen_k == 512);

  // An append longer than the capacity: the rows past it are dropped
  s.s_new = 600, s.seqlens = true;
  const warpattn::detail::KvCacheCall over = validated(make_call(s));
  CHECK(over.appended == 600 && over.work.appended == 512) << over.appended << " " << over.work.appended;

  // Head dims: the padded ones run in the next compiled one up (above 256: the 512 kernel), with
  // and without an append
  for (int64_t d : {64, 72, 128, 200, 256, 264, 384, 504, 512})
    for (int64_t s_new : {0, 3}) {
      Spec h;
      h.head_dim = d, h.s_new = s_new;
      const warpattn::detail::KvCacheCall r = validated(make_call(h));
      CHECK(r.problem.head_dim == d) << d;
      CHECK(r.problem.kernel_dim() == (d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 512))
          << d << " " << r.problem.kernel_dim();
      CHECK(r.appended == s_new) << d;
    }
}

TEST(kvcache_call_sizes_paged) {
  for (int64_t ps : {1, 5, 16, 32, 48, 64, 128, 256, 1024}) {
    Spec s;  // 40 pages, 10 pages per sequence
    s.page_size = ps;
    const Call c = make_paged(s);
    REQUIRE(!error_of(c)) << *error_of(c);
    const warpattn::detail::KvCacheCall k = validated(c);
    const int64_t capacity = 10 * ps;
    CHECK(k.problem.batch == 3 && k.problem.seqlen_q == 4 && k.problem.seqlen_k == capacity)
        << ps << ": " << k.problem.batch << " " << k.problem.seqlen_q << " " << k.problem.seqlen_k;
    CHECK(k.problem.heads_q == 8 && k.problem.heads_kv == 2 && k.problem.head_dim == 128);
    CHECK(k.pages.table == static_cast<const int*>(fake(kTable)));
    CHECK(k.pages.table_stride == 10 && k.pages.num_pages == 40) << k.pages.table_stride << " " << k.pages.num_pages;
    CHECK(k.pages.page_size == ps) << ps << " " << k.pages.page_size;
    CHECK(k.work.capacity == capacity && k.work.appended == 2);
    CHECK(k.work.cache_seqlens == static_cast<const int*>(fake(kSeqlens)));
    CHECK(k.appended == 2);
  }
  // A padded table: its row stride
  Call c = make_paged();
  c.cache.block_table->stride[0] = 16;
  CHECK(validated(c).pages.table_stride == 16);
  // The window's bound and the sinks, resolved over the capacity
  c = make_paged();
  c.options.window_left = 100, c.options.window_right = 0;
  c.options.sinks = view(kSinks, DType::f32, {8});
  const warpattn::detail::KvCacheCall k = validated(c);
  CHECK(k.problem.banded && k.problem.band.left == 100 && k.problem.band.right == 0);
  CHECK(k.problem.sinks == static_cast<const float*>(fake(kSinks)));
  // A window wider than Sq + capacity bounds nothing
  c.options.sinks.reset();
  c.options.window_left = 4 + 640, c.options.window_right = -1;
  CHECK(!validated(c).problem.banded) << "window_left >= seqlen_q + capacity is unbounded";
  // The largest capacity within 32-bit key indices
  Spec big;
  big.page_size = 16, big.max_pages = (int64_t(1) << 27) - 1, big.s_new = 0;
  c = make_paged(big);
  c.cache.block_table->data = fake(uintptr_t(1) << 40);  // 1.5 GiB of table, apart from the rest
  REQUIRE(!error_of(c)) << *error_of(c);
  CHECK(validated(c).problem.seqlen_k == (int64_t(1) << 31) - 16) << validated(c).problem.seqlen_k;
  CHECK(validated(c).work.capacity == INT_MAX - 15);
}

// ---- 2. rejected calls, each naming its argument

TEST(kvcache_new_keys_and_values) {
  Call c = make_call();
  c.cache.v.reset();
  EXPECT_REJECTED(c, "v", "the new keys and values come together", "got k alone");
  c = make_call();
  c.cache.k.reset();
  EXPECT_REJECTED(c, "k", "the new keys and values come together", "got v alone");
  c = make_paged();
  c.cache.k.reset();
  EXPECT_REJECTED(c, "k", "come together");
  // Append without the lengths: where would the rows go?
  Spec s;
  s.seqlens = false;
  EXPECT_REJECTED(make_call(s), "cache_seqlens", "needed to append k and v");
  EXPECT_REJECTED(make_paged(s), "cache_seqlens", "needed to append k and v");
  // Heads of the new keys vs the cache's (GQA-valid for q: 4 divides 8)
  c = make_call();
  c.cache.k = view(kKNew, DType::bf16, {3, 2, 4, 128});
  c.cache.v = view(kVNew, DType::bf16, {3, 2, 4, 128});
  EXPECT_REJECTED(c, "k", "expected shape (3, 2, 2, 128)", "heads and head_dim as k_cache", "got (3, 2, 4, 128)");
  c = make_paged();
  c.cache.k = view(kKNew, DType::bf16, {3, 2, 1, 128});
  c.cache.v = view(kVNew, DType::bf16, {3, 2, 1, 128});
  EXPECT_REJECTED(c, "k", "expected shape (3, 2, 2, 128)", "as k_cache");
  // Only v's heads wrong: v is shaped as k
  c = make_call();
  c.cache.v = view(kVNew, DType::bf16, {3, 2, 4, 128});
  EXPECT_REJECTED(c, "v", "expected shape (3, 2, 2, 128)", "got (3, 2, 4, 128)");
  // Head dim of the new keys vs the cache's (= q's)
  c = make_call();
  c.cache.k = view(kKNew, DType::bf16, {3, 2, 2, 64});
  c.cache.v = view(kVNew, DType::bf16, {3, 2, 2, 64});
  EXPECT_REJECTED(c, "k", "head_dim", "128", "got 64");
  c = make_call();
  c.cache.v = view(kVNew, DType::bf16, {3, 2, 2, 64});
  EXPECT_REJECTED(c, "v", "heads and head_dim as v_cache", "expected shape (3, 2, 2, 128)", "got (3, 2, 2, 64)");
  // Batch and rows of the new values
  c = make_call();
  c.cache.k = view(kKNew, DType::bf16, {2, 2, 2, 128});
  c.cache.v = view(kVNew, DType::bf16, {2, 2, 2, 128});
  EXPECT_REJECTED(c, "k", "expected batch 3 (same as q), got 2");
  c = make_call();
  c.cache.v = view(kVNew, DType::bf16, {3, 3, 2, 128});
  EXPECT_REJECTED(c, "v", "expected shape (3, 2, 2, 128)", "got (3, 3, 2, 128)");
  // dtype and rank
  c = make_call();
  c.cache.k->dtype = DType::f16, c.cache.v->dtype = DType::f16;
  EXPECT_REJECTED(c, "k", "expected dtype bfloat16 (same as q)", "got float16");
  c = make_call();
  c.cache.k->rank = 3;
  EXPECT_REJECTED(c, "k", "expected rank 4");
}

TEST(kvcache_cache_tensors) {
  // v_cache shaped as k_cache
  Call c = make_call();
  c.cache.v_cache = view(kVCache, DType::bf16, {3, 511, 2, 128});
  EXPECT_REJECTED(c, "v_cache", "expected shape (3, 512, 2, 128) (same as k_cache)", "got (3, 511, 2, 128)");
  c = make_paged();
  c.cache.v_cache = view(kVCache, DType::bf16, {39, 64, 2, 128});
  EXPECT_REJECTED(c, "v_cache", "expected shape (40, 64, 2, 128) (same as k_cache)", "got (39, 64, 2, 128)");
  c = make_paged();
  c.cache.v_cache = view(kVCache, DType::bf16, {40, 32, 2, 128});
  EXPECT_REJECTED(c, "v_cache", "expected shape (40, 64, 2, 128)");
  c = make_paged();
  c.cache.v_cache = view(kVCache, DType::bf16, {40, 64, 1, 128});
  EXPECT_REJECTED(c, "v_cache", "(same as k_cache)", "got (40, 64, 1, 128)");
  // A dense cache's batch is q's
  c = make_call();
  c.cache.k_cache = view(kKCache, DType::bf16, {4, 512, 2, 128});
  c.cache.v_cache = view(kVCache, DType::bf16, {4, 512, 2, 128});
  EXPECT_REJECTED(c, "k_cache", "expected batch 3 (same as q), got 4");
  // ... a paged one's first axis is its pages: any count
  c = make_paged();
  c.cache.k_cache = view(kKCache, DType::bf16, {7, 64, 2, 128});
  c.cache.v_cache = view(kVCache, DType::bf16, {7, 64, 2, 128});
  EXPECT_ACCEPTED(c, "7 pages for 3 sequences");
  // dtype, head dim, contiguity, rank, with the paged dimension names
  c = make_paged();
  c.cache.k_cache.dtype = DType::f16, c.cache.v_cache.dtype = DType::f16;
  EXPECT_REJECTED(c, "k_cache", "expected dtype bfloat16 (same as q)");
  c = make_paged();
  c.cache.v_cache.stride[3] = 2;
  EXPECT_REJECTED(c, "v_cache", "last dimension (head_dim) must be contiguous");
  c = make_paged();
  c.cache.k_cache.rank = 3;
  EXPECT_REJECTED(c, "k_cache", "expected rank 4 (num_pages, page_size, heads, head_dim)", "got rank 3");
  c = make_call();
  c.cache.k_cache.rank = 3;
  EXPECT_REJECTED(c, "k_cache", "expected rank 4 (batch, seqlen, heads, head_dim)");
  c = make_paged();
  c.cache.k_cache.stride[0] = 64 * 2 * 128 + 4;  // a page's stride not a multiple of 16 bytes
  c.cache.v_cache = c.cache.k_cache, c.cache.v_cache.data = fake(kVCache);
  EXPECT_REJECTED(c, "k_cache", "stride[0] (num_pages)", "multiple of 16 bytes");
  c = make_call();
  c.cache.k_cache.data = nullptr;
  EXPECT_REJECTED(c, "k_cache", "data is null");
}

TEST(kvcache_gqa_message_names_k_cache) {
  // The cache's heads must divide q's; the message should name the cache, not "k" (the new
  // keys' name in this call).
  Spec s;
  s.heads_kv = 3, s.s_new = 0;
  const std::optional<std::string> m = error_of(make_call(s));
  REQUIRE(m.has_value()) << "Hq 8 over Hkv 3 accepted";
  CHECK(m->find("must be a multiple of key/value heads (3)") != std::string::npos) << *m;
  CHECK(m->rfind("k_cache: ", 0) == 0) << "names the wrong argument: " << *m;
}

TEST(kvcache_cache_seqlens_rules) {
  Call c = make_call();
  c.cache.cache_seqlens = view(kSeqlens, DType::s32, {4});
  EXPECT_REJECTED(c, "cache_seqlens", "expected 3 entries (batch, one per sequence of q), got 4");
  c = make_paged();
  c.cache.cache_seqlens = view(kSeqlens, DType::s32, {2});
  EXPECT_REJECTED(c, "cache_seqlens", "expected 3 entries", "got 2");
  c = make_call();
  c.cache.cache_seqlens->dtype = DType::f32;
  EXPECT_REJECTED(c, "cache_seqlens", "expected dtype int32", "got float32");
  c = make_call();
  c.cache.cache_seqlens->stride[0] = 2;
  EXPECT_REJECTED(c, "cache_seqlens", "must be contiguous (stride[0] == 1)", "got stride[0] = 2");
  c = make_call();
  c.cache.cache_seqlens->rank = 2, c.cache.cache_seqlens->shape[1] = 1;
  EXPECT_REJECTED(c, "cache_seqlens", "expected rank 1 (batch)", "got rank 2");
  c = make_call();
  c.cache.cache_seqlens->data = nullptr;
  EXPECT_REJECTED(c, "cache_seqlens", "data is null");
  c = make_call();
  c.cache.cache_seqlens->data = fake(kSeqlens + 2);
  EXPECT_REJECTED(c, "cache_seqlens", "4-byte aligned");
  // Without an append too
  Spec s;
  s.s_new = 0;
  c = make_call(s);
  c.cache.cache_seqlens->shape[0] = 1;
  EXPECT_REJECTED(c, "cache_seqlens", "expected 3 entries", "got 1");
}

TEST(kvcache_block_table_rules) {
  Call c = make_paged();
  c.cache.block_table->dtype = DType::f32;
  EXPECT_REJECTED(c, "block_table", "expected dtype int32", "got float32");
  c = make_paged();
  c.cache.block_table = view(kTable, DType::s32, {2, 10});
  EXPECT_REJECTED(c, "block_table", "expected shape (3, 10) (batch as q, max_pages)", "got (2, 10)");
  c = make_paged();
  c.cache.block_table->stride[1] = 3, c.cache.block_table->stride[0] = 30;
  EXPECT_REJECTED(c, "block_table", "last dimension (max_pages) must be contiguous (stride[1] == 1)", "got stride[1] = 3");
  c = make_paged();
  c.cache.block_table = view(kTable, DType::s32, {10});
  EXPECT_REJECTED(c, "block_table", "expected rank 2 (batch, max_pages)", "got rank 1");
  c = make_paged();
  c.cache.block_table->data = nullptr;
  EXPECT_REJECTED(c, "block_table", "data is null");
  c = make_paged();
  c.cache.block_table->data = fake(kTable + 2);
  EXPECT_REJECTED(c, "block_table", "4-byte aligned");
  c = make_paged();
  c.cache.block_table->stride[0] = -10;
  EXPECT_REJECTED(c, "block_table", "stride[0] (batch) must not be negative");
  c = make_paged();
  c.cache.block_table->shape[1] = -1;
  EXPECT_REJECTED(c, "block_table", "must not be negative");
  // a paged cache without pages (its tensor map could not be made after the append)
  {
    Spec s;
    s.num_pages = 0;
    EXPECT_REJECTED(make_paged(s), "k_cache", "a paged cache needs at least one page", "got 0");
  }
  // page sizes: at least 1
  {
    Spec s;
    s.page_size = 0;
    EXPECT_REJECTED(make_paged(s), "k_cache", "page_size (shape[1]) must be at least 1", "got 0");
  }
  // capacity: max_pages x page_size < 2^31
  Spec s;
  s.page_size = 16, s.max_pages = int64_t(1) << 27, s.s_new = 0;
  c = make_paged(s);
  c.cache.block_table->data = fake(uintptr_t(1) << 40);
  EXPECT_REJECTED(c, "block_table", "max_pages x page_size = 134217728 x 16", "must be less than 2^31");
  s.page_size = int64_t(1) << 20, s.max_pages = 1 << 11, s.num_pages = 2, s.heads_kv = 1, s.head_dim = 8;
  c = make_paged(s);
  EXPECT_REJECTED(c, "block_table", "max_pages x page_size", "must be less than 2^31");
  s.page_size = 16, s.max_pages = int64_t(1) << 31, s.num_pages = 40, s.heads_kv = 2, s.head_dim = 128;
  c = make_paged(s);
  c.cache.block_table->data = fake(uintptr_t(1) << 40);
  EXPECT_REJECTED(c, "block_table", "must be less than 2^31");
  // A sliding window needs Sq + capacity < 2^30
  s.max_pages = int64_t(1) << 26;
  c = make_paged(s);
  c.cache.block_table->data = fake(uintptr_t(1) << 40);
  EXPECT_ACCEPTED(c, "capacity 2^30");
  c.options.window_left = 64;
  EXPECT_REJECTED(c, "options.window_left/right", "below 2^30");
}

TEST(kvcache_overlap_rules) {
  // out apart from the caches (read by the call)
  Call c = make_call();
  c.out.data = fake(kKCache + 4096);
  EXPECT_REJECTED(c, "out", "must not overlap k_cache");
  c = make_paged();
  c.out.data = fake(kVCache);
  EXPECT_REJECTED(c, "out", "must not overlap v_cache");
  Spec read_only;
  read_only.s_new = 0;
  c = make_call(read_only);  // (appending, k_cache would be named first: it is written too)
  c.lse->data = fake(kKCache);
  EXPECT_REJECTED(c, "lse", "must not overlap k_cache");
  c = make_call();
  c.lse->data = fake(kKCache);
  EXPECT_REJECTED(c, "k_cache", "must not overlap lse");
  // out and lse apart from the lengths, the table, the new rows
  c = make_paged();
  c.out.data = fake(kTable);
  EXPECT_REJECTED(c, "out", "must not overlap block_table");
  c = make_call();
  c.cache.cache_seqlens->data = fake(kLse + 16);
  EXPECT_REJECTED(c, "lse", "must not overlap cache_seqlens");
  c = make_call();
  c.out.data = fake(kKNew);
  EXPECT_REJECTED(c, "out", "must not overlap k");
  // Appending writes the caches: apart from each other, from q and from everything else
  c = make_call();
  c.cache.v_cache.data = c.cache.k_cache.data;
  EXPECT_REJECTED(c, "k_cache", "must not overlap v_cache");
  c = make_paged();
  c.cache.v_cache.data = fake(kKCache + 64 * 2 * 128 * 2);  // one page in
  EXPECT_REJECTED(c, "k_cache", "must not overlap v_cache");
  c = make_call();
  c.cache.k_cache.data = fake(kQ);
  EXPECT_REJECTED(c, "k_cache", "must not overlap q");
  c = make_paged();
  c.cache.v_cache.data = fake(kQ + 1024);
  EXPECT_REJECTED(c, "v_cache", "must not overlap q");
  c = make_call();
  c.cache.k->data = fake(kKCache + 256);
  EXPECT_REJECTED(c, "k_cache", "must not overlap k");
  c = make_paged();
  c.cache.v->data = fake(kVCache);
  EXPECT_REJECTED(c, "v_cache", "must not overlap v");
  c = make_paged();
  c.cache.block_table->data = fake(kKCache + 128);
  EXPECT_REJECTED(c, "k_cache", "must not overlap block_table");
  c = make_call();
  c.cache.cache_seqlens->data = fake(kVCache + 128);
  EXPECT_REJECTED(c, "v_cache", "must not overlap cache_seqlens");
  c = make_call();
  c.options.sinks = view(kKCache + 64, DType::f32, {8});
  EXPECT_REJECTED(c, "k_cache", "must not overlap sinks");
  // ... without the append, the same layouts read only are fine
  Spec s;
  s.s_new = 0;
  c = make_paged(s);
  c.cache.block_table->data = fake(kKCache + 128);
  EXPECT_ACCEPTED(c, "block_table inside k_cache, read only");
}

TEST(kvcache_options_rules) {
  Call c = make_paged();
  c.options.sinks = view(kSinks, DType::f32, {2});
  EXPECT_REJECTED(c, "sinks", "expected shape (8) (one logit per query head)", "got (2)");
  c = make_call();
  c.options.causal = true, c.options.window_right = 3;
  EXPECT_REJECTED(c, "options.window_right", "expected -1 or 0 with causal");
  c = make_call();
  c.options.softmax_scale = -1.f;
  EXPECT_REJECTED(c, "softmax_scale", "finite positive");
  c = make_call();
  c.lse = view(kLse, DType::f32, {3, 4, 8});  // (B, Sq, Hq): the common mistake
  EXPECT_REJECTED(c, "lse", "expected shape (batch, heads_q, seqlen_q) = (3, 8, 4)", "got (3, 4, 8)");
  c = make_call();
  c.out = view(kOut, DType::bf16, {3, 5, 8, 128});
  EXPECT_REJECTED(c, "out", "expected shape (3, 4, 8, 128) (same as q)");
  c = make_call();
  c.q.shape[3] = 100, c.q.stride[2] = 104, c.q.stride[1] = 8 * 104, c.q.stride[0] = 4 * 8 * 104;
  EXPECT_REJECTED(c, "q", "head_dim (shape[3]) must be a multiple of 8 from 8 to 512", "got 100");
  // Past 512: the message names the range
  Spec wide;
  wide.head_dim = 520;
  EXPECT_REJECTED(make_call(wide), "q", "head_dim (shape[3]) must be a multiple of 8 from 8 to 512", "got 520");
}

TEST(kvcache_plan_tiles_within_2_31) {
  // Without GQA (nothing to pack): batch x heads x ceil(Sq / 128) tiles: 2^15 x 2^15 x
  // ceil(129 / 128) = 2^31. The tensors are huge (q spans 2^40 bytes): each at its own
  // 2^42-byte slot, never touched (read-only caches may overlap).
  const uintptr_t slot = uintptr_t(1) << 42;
  Call c;
  c.q = view(1 * slot, DType::bf16, {1 << 15, 129, 1 << 15, 8});
  c.out = view(2 * slot, DType::bf16, {1 << 15, 129, 1 << 15, 8});
  c.cache.k_cache = view(3 * slot, DType::bf16, {4, 16, 1 << 15, 8});
  c.cache.v_cache = view(3 * slot + 0x100000, DType::bf16, {4, 16, 1 << 15, 8});
  c.cache.block_table = view(3 * slot + 0x200000, DType::s32, {1 << 15, 1});
  EXPECT_REJECTED(c, "q", "batch x heads / 1 x ceil(seqlen_q / 128) = 2147483648", "must be less than 2^31");
  // 128 query rows: one block each, 2^30 tiles
  c.q = view(1 * slot, DType::bf16, {1 << 15, 128, 1 << 15, 8});
  c.out = view(2 * slot, DType::bf16, {1 << 15, 128, 1 << 15, 8});
  EXPECT_ACCEPTED(c, "2^30 tiles");
  // MQA packs 128 query heads per tile: the same shape with one KV head has 2^15 x 129 x 2^8 tiles
  c.q = view(1 * slot, DType::bf16, {1 << 15, 129, 1 << 15, 8});
  c.out = view(2 * slot, DType::bf16, {1 << 15, 129, 1 << 15, 8});
  c.cache.k_cache = view(3 * slot, DType::bf16, {4, 16, 1, 8});
  c.cache.v_cache = view(3 * slot + 0x100000, DType::bf16, {4, 16, 1, 8});
  EXPECT_ACCEPTED(c, "MQA, 128 heads a tile");
  // 129 query positions of 2^16 sequences at 2^15 / 128 chunks of heads: 2^16 x 129 x 2^8 > 2^31
  c.q = view(1 * slot, DType::bf16, {1 << 16, 129, 1 << 15, 8});
  c.out = view(2 * slot, DType::bf16, {1 << 16, 129, 1 << 15, 8});
  c.cache.block_table = view(3 * slot + 0x200000, DType::s32, {1 << 16, 1});
  EXPECT_REJECTED(c, "q", "batch x heads / 128 x ceil(seqlen_q / 1) = 2164260864", "must be less than 2^31");
  // One query row (decode), no GQA: B x Hq = 2^16 x 2^15, dense
  c.q = view(1 * slot, DType::bf16, {1 << 16, 1, 1 << 15, 8});
  c.out = view(2 * slot, DType::bf16, {1 << 16, 1, 1 << 15, 8});
  c.cache.block_table.reset();
  c.cache.k_cache = view(3 * slot, DType::bf16, {1 << 16, 16, 1 << 15, 8});
  c.cache.v_cache = view(4 * slot, DType::bf16, {1 << 16, 16, 1 << 15, 8});
  EXPECT_REJECTED(c, "q", "work tiles must be less than 2^31");
  // 2^15 - 1 heads (strides as before: padded heads, still valid), as many KV heads
  c.q.shape[2] = c.out.shape[2] = c.cache.k_cache.shape[2] = c.cache.v_cache.shape[2] = (1 << 15) - 1;
  EXPECT_ACCEPTED(c, "2^31 - 2^16 tiles");
}

TEST(kvcache_plan_tiles_within_2_31_at_512) {
  // The 512 kernel's tiles are 64 rows (kvcache_block_m): 2^15 x 2^15 x ceil(65 / 64) = 2^31,
  // where 128-row tiles take 65 rows in one. Slots of 2^47 bytes (q spans 65 x 2^40).
  const uintptr_t slot = uintptr_t(1) << 47;
  Call c;
  c.q = view(1 * slot, DType::bf16, {1 << 15, 65, 1 << 15, 512});
  c.out = view(2 * slot, DType::bf16, {1 << 15, 65, 1 << 15, 512});
  c.cache.k_cache = view(3 * slot, DType::bf16, {4, 16, 1 << 15, 512});
  c.cache.v_cache = view(3 * slot + 0x10000000, DType::bf16, {4, 16, 1 << 15, 512});
  c.cache.block_table = view(3 * slot + 0x20000000, DType::s32, {1 << 15, 1});
  EXPECT_REJECTED(c, "q", "batch x heads / 1 x ceil(seqlen_q / 64) = 2147483648", "must be less than 2^31");
  // 64 query rows: one block each, 2^30 tiles
  c.q = view(1 * slot, DType::bf16, {1 << 15, 64, 1 << 15, 512});
  c.out = view(2 * slot, DType::bf16, {1 << 15, 64, 1 << 15, 512});
  EXPECT_ACCEPTED(c, "2^30 tiles at 512");
  // MQA packs 64 query heads per tile at 512 (128 below): 2^15 x 129 x 2^9 = 2^24 x 129 > 2^31
  c.q = view(1 * slot, DType::bf16, {1 << 15, 129, 1 << 15, 512});
  c.out = view(2 * slot, DType::bf16, {1 << 15, 129, 1 << 15, 512});
  c.cache.k_cache = view(3 * slot, DType::bf16, {4, 16, 1, 512});
  c.cache.v_cache = view(3 * slot + 0x10000000, DType::bf16, {4, 16, 1, 512});
  EXPECT_REJECTED(c, "q", "batch x heads / 64 x ceil(seqlen_q / 1) = 2164260864", "must be less than 2^31");
  // 2^14 sequences: 2^23 x 129 tiles
  c.q.shape[0] = c.out.shape[0] = c.cache.block_table->shape[0] = 1 << 14;
  EXPECT_ACCEPTED(c, "MQA, 64 heads a tile");
}

// ---- 3. where each cached key is loaded from

namespace {
using warpattn::detail::cache_box;
using warpattn::detail::cache_box_rows;
using warpattn::detail::CacheBox;
using warpattn::detail::KvPages;
}  // namespace

TEST(cache_box_follows_the_block_table) {
  std::mt19937_64 rng(16);
  int bad = 0;
  for (int trial = 0; trial < 400; ++trial) {
    // Page sizes: powers of two from 16 and any size from 1 to 100
    const int batch = 1 + static_cast<int>(rng() % 4);
    const int page_size = trial % 2 ? 16 << (rng() % 4) : 1 + static_cast<int>(rng() % 100);
    const int max_pages = 1 + static_cast<int>(rng() % 6), num_pages = 1 + static_cast<int>(rng() % 12);
    const int stride = max_pages + static_cast<int>(rng() % 3);
    const int capacity = max_pages * page_size;
    // Entries mostly valid, some negative or past the cache (never read, zero-filled)
    std::vector<int> table(static_cast<size_t>(batch) * stride, 12345);
    for (int b = 0; b < batch; ++b)
      for (int p = 0; p < max_pages; ++p) {
        const int r = static_cast<int>(rng() % 10);
        table[b * stride + p] = r == 0 ? -1 - static_cast<int>(rng() % 3)
                                : r == 1 ? num_pages + static_cast<int>(rng() % 3)
                                         : static_cast<int>(rng() % num_pages);
      }
    KvPages kv;
    kv.table = table.data(), kv.table_stride = stride, kv.num_pages = num_pages;
    kv.page_size = page_size;
    for (int b = 0; b < batch; ++b) {
      const int seqlen = static_cast<int>(rng() % (capacity + 1));
      for (int key = 0; key < capacity + 40; ++key) {
        const CacheBox got = cache_box(kv, b, key, seqlen);
        int want_page = -1, want_row = 0;
        if (key < seqlen) {
          const int entry = table[b * stride + key / page_size];
          if (entry >= 0 && entry < num_pages) want_page = entry, want_row = key % page_size;
        }
        const bool ok = got.page == want_page && (want_page < 0 || got.row == want_row);
        if (!ok && ++bad <= 10) {
          CHECK(false) << "b " << b << " key " << key << " seqlen " << seqlen << " page_size " << page_size << ": got ("
                       << got.page << ", " << got.row << ") want (" << want_page << ", " << want_row << ")";
        }
        if (want_page < 0) {
          CHECK(got.page == -1) << "zero-filled boxes are page -1, got " << got.page;
        }
      }
    }
  }
  CHECK(bad == 0) << bad << " mismatches";
}

TEST(cache_box_dense) {
  KvPages kv;  // table null
  kv.num_pages = 5;
  for (int b = 0; b < 5; ++b)
    for (int seqlen : {0, 1, 100, 512})
      for (int key = 0; key < 600; ++key) {
        const CacheBox got = cache_box(kv, b, key, seqlen);
        if (key < seqlen)
          CHECK(got.page == b && got.row == key) << b << " " << key << ": (" << got.page << ", " << got.row << ")";
        else
          CHECK(got.page == -1) << b << " " << key << " " << seqlen << ": " << got.page;
      }
}

TEST(cache_box_rows_values) {
  CHECK(cache_box_rows(176, 128) == 16) << cache_box_rows(176, 128);
  CHECK(cache_box_rows(128, 16) == 16) << cache_box_rows(128, 16);
  CHECK(cache_box_rows(128, 256) == 128) << cache_box_rows(128, 256);
  CHECK(cache_box_rows(80, 256) == 16) << cache_box_rows(80, 256);
  CHECK(cache_box_rows(128, 128) == 128) << cache_box_rows(128, 128);
  CHECK(cache_box_rows(64, 1024) == 64) << cache_box_rows(64, 1024);
  CHECK(cache_box_rows(192, 256) == 64) << cache_box_rows(192, 256);
  CHECK(cache_box_rows(128, 1) == 1) << cache_box_rows(128, 1);
  CHECK(cache_box_rows(128, 48) == 16) << cache_box_rows(128, 48);
  CHECK(cache_box_rows(80, 24) == 8) << cache_box_rows(80, 24);
  CHECK(cache_box_rows(128, 12) == 4) << cache_box_rows(128, 12);
  CHECK(cache_box_rows(128, 7) == 1) << cache_box_rows(128, 7);
  for (int block_n : {64, 80, 128, 176, 192, 256}) CHECK(cache_box_rows(block_n, 0) == block_n) << block_n;
  // The largest power of two dividing both
  for (int block_n = 16; block_n <= 256; block_n += 16)
    for (int page = 1; page <= 4096; page += page < 300 ? 1 : 97) {
      const int rows = cache_box_rows(block_n, page);
      CHECK(rows > 0 && block_n % rows == 0 && page % rows == 0 && (rows & (rows - 1)) == 0)
          << block_n << " " << page << " " << rows;
      CHECK(block_n % (2 * rows) != 0 || page % (2 * rows) != 0) << "not the largest: " << block_n << " " << page;
    }
}

TEST(cache_boxes_lie_within_one_page) {
  std::mt19937_64 rng(3);
  for (int block_n : {64, 80, 128, 176, 192, 256})
    for (int page_size : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 100, 128, 256, 512}) {
      const int rows = cache_box_rows(block_n, page_size);
      const int max_pages = 1 + (4 * block_n) / page_size, num_pages = 3 * max_pages;
      const int batch = 2;
      std::vector<int> table(batch * max_pages);
      for (int& e : table) e = static_cast<int>(rng() % num_pages);
      KvPages kv;
      kv.table = table.data(), kv.table_stride = max_pages, kv.num_pages = num_pages;
      kv.page_size = page_size, kv.box_rows = rows, kv.boxes = block_n / rows;
      const int capacity = max_pages * page_size;
      for (int b = 0; b < batch; ++b)
        for (int start = 0; start < capacity; start += rows) {
          const CacheBox first = cache_box(kv, b, start, capacity);
          CHECK(first.page == table[b * max_pages + start / page_size]) << block_n << " " << page_size << " " << start;
          CHECK(first.row % rows == 0) << "a box starts on a multiple of its rows: " << first.row;
          for (int i = 1; i < rows && start + i < capacity; ++i) {
            const CacheBox k = cache_box(kv, b, start + i, capacity);
            CHECK(k.page == first.page && k.row == first.row + i)
                << "block_n " << block_n << " page " << page_size << " box at " << start << " key +" << i;
          }
        }
      // A tile of block_n keys is kv.boxes whole boxes
      CHECK(kv.boxes * rows == block_n);
    }
}

// ---- 4. each sequence's keys (decode_plan.hpp, kv_cache_keys)

namespace {
using warpattn::detail::KvCacheWork;
using warpattn::detail::kv_cache_keys;

int want_keys(const int* used, int b, int capacity, int appended) {
  const long long cached = used ? std::min<long long>(std::max<long long>(used[b], 0), capacity) : capacity;
  return static_cast<int>(std::min<long long>(cached + appended, capacity));
}
}  // namespace

TEST(kv_cache_keys_clamps_to_the_capacity) {
  const std::vector<int> used = {-5, 0, 1, 100, 511, 512, 513, 100000, INT_MIN, INT_MAX, -1};
  for (int capacity : {0, 1, 512, INT_MAX})
    for (int appended : {0, 1, 3, 600, INT_MAX - 1, INT_MAX})
      for (bool with_used : {true, false}) {
        KvCacheWork w;
        w.cache_seqlens = with_used ? used.data() : nullptr;
        w.capacity = capacity, w.appended = appended;
        for (int b = 0; b < static_cast<int>(used.size()); ++b) {
          const int want = want_keys(w.cache_seqlens, b, capacity, appended), got = kv_cache_keys(w, b);
          CHECK(got == want) << "used " << (with_used ? used[b] : -999) << " capacity " << capacity << " appended "
                             << appended << ": got " << got << " want " << want;
          CHECK(got >= 0 && got <= capacity);
        }
      }
  // Explicit cases
  const int lens[4] = {-3, 10, 600, 500};
  KvCacheWork w;
  w.cache_seqlens = lens, w.capacity = 512, w.appended = 4;
  CHECK(kv_cache_keys(w, 0) == 4) << "negative: clamped to 0, plus the append";
  CHECK(kv_cache_keys(w, 1) == 14);
  CHECK(kv_cache_keys(w, 2) == 512) << "past the capacity: the capacity";
  CHECK(kv_cache_keys(w, 3) == 504);
  w.appended = 20;
  CHECK(kv_cache_keys(w, 3) == 512) << "append overflowing the capacity";
  w.cache_seqlens = nullptr, w.appended = 0;
  CHECK(kv_cache_keys(w, 2) == 512) << "no lengths: the full cache";
  // Random
  std::mt19937_64 rng(9);
  std::vector<int> rand_used(64);
  for (int trial = 0; trial < 2000; ++trial) {
    for (int& u : rand_used) u = static_cast<int>(rng() % 3000) - 500;
    KvCacheWork r;
    r.cache_seqlens = rand_used.data(), r.capacity = static_cast<int>(rng() % 2500);
    r.appended = static_cast<int>(rng() % 700);
    for (int b = 0; b < 64; ++b)
      CHECK(kv_cache_keys(r, b) == want_keys(rand_used.data(), b, r.capacity, r.appended));
  }
}

// The validated call's work is what the kernel reads: lengths within the capacity
TEST(kvcache_call_lengths_within_capacity) {
  Spec s;
  s.s_new = 600;  // more than the 512 of capacity
  const warpattn::detail::KvCacheCall k = validated(make_call(s));
  const int lens[3] = {0, 300, 512};
  KvCacheWork w = k.work;
  w.cache_seqlens = lens;  // the device array, on the host here
  for (int b = 0; b < 3; ++b) CHECK(kv_cache_keys(w, b) == 512) << b << ": " << kv_cache_keys(w, b);
}

// ---- 5. GQA packing (decode_plan.hpp): the heads a tile packs and where each of its rows goes

TEST(gqa_packing_takes_the_largest_divisor_that_fits) {
  using warpattn::detail::gqa_packing;
  struct Want {
    int group, heads, positions;
  };
  for (const Want w : {Want{1, 1, 128}, Want{4, 4, 32}, Want{8, 8, 16}, Want{3, 3, 42}, Want{6, 6, 21},
                       Want{128, 128, 1}, Want{256, 128, 1}, Want{160, 80, 1}, Want{200, 100, 1}, Want{131, 1, 128}}) {
    const auto p = gqa_packing(w.group, 128);
    CHECK(p.heads == w.heads && p.positions == w.positions)
        << "group " << w.group << ": expected " << w.heads << " heads x " << w.positions << " positions, got "
        << p.heads << " x " << p.positions;
  }
  // Brute force: heads divides the group, fits with its positions in the tile, and no larger
  // divisor does.
  for (int group = 1; group <= 600; ++group) {
    const auto p = gqa_packing(group, 128);
    int best = 1;
    for (int h = 1; h <= 128 && h <= group; ++h)
      if (group % h == 0) best = h;
    CHECK(p.heads == best && p.positions == 128 / best && p.heads * p.positions <= 128)
        << "group " << group << ": got " << p.heads << " x " << p.positions << ", want " << best;
  }
}

TEST(packed_rows_cover_each_position_and_head_once) {
  using warpattn::detail::gqa_packing;
  using warpattn::detail::packed_row;
  for (int group : {1, 3, 4, 16, 160}) {
    const auto p = gqa_packing(group, 128);
    for (int sq : {1, 5, 130}) {
      // every (position, head of the chunk) pair appears in exactly one row of one block
      std::vector<int> seen(static_cast<size_t>(sq) * p.heads, 0);
      const int blocks = (sq + p.positions - 1) / p.positions;
      for (int m = 0; m < blocks; ++m)
        for (int row = 0; row < 128; ++row) {
          const auto pr = packed_row(row, p.heads);
          const int position = m * p.positions + pr.position;
          if (pr.position >= p.positions || position >= sq) continue;  // rows the epilogue skips
          ++seen[static_cast<size_t>(position) * p.heads + pr.head_in_group];
        }
      for (size_t i = 0; i < seen.size(); ++i)
        CHECK(seen[i] == 1) << "group " << group << " Sq " << sq << ": pair " << i << " stored " << seen[i] << " times";
    }
  }
}

// ---- 6. split keys: the launch's pieces (kv_cache_pieces.hpp, kv_cache_piece)

TEST(kvcache_pieces_cover_each_tile_once_in_order) {
  using namespace warpattn::detail;
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const bool causal = trial % 2 == 1;
    const int positions = 1 << (rng() % 8);  // a packed tile's positions
    const int block_n = trial % 3 == 0 ? 176 : 128;
    const int batch = 1 + static_cast<int>(rng() % 5), chunks = 1 + static_cast<int>(rng() % 4);
    const int seqlen_q = 1 + static_cast<int>(rng() % 300);
    std::vector<int> lens(batch);
    for (int& l : lens) l = static_cast<int>(rng() % 6000) - 100;
    KvCacheWork w;
    w.cache_seqlens = lens.data(), w.capacity = 5000, w.appended = static_cast<int>(rng() % 3);
    w.splits = 1 + static_cast<int>(rng() % 9);
    const TileGrid grid{ceil_div(seqlen_q, positions), chunks, batch, 1};
    const int tiles = grid.m_blocks * chunks * batch;
    w.pieces = tiles * w.splits;
    const KeyBand band = causal_band(causal);
    std::vector<int> seen(tiles, 0);
    for (int u = 0; u < tiles; ++u) {
      const KvCachePiece first = kv_cache_piece(u * w.splits, w, grid, positions, block_n, seqlen_q, band);
      CHECK(first.seqlen_k == kv_cache_keys(w, first.tile.batch));
      const WorkTile t = first.tile;
      seen[(t.batch * chunks + t.head) * grid.m_blocks + t.m_block]++;
      const KeyTileRange want = kv_tile_range(t.m_block, positions, block_n, seqlen_q, first.seqlen_k, band);
      int covered = want.begin;  // the pieces in order: each starts where the last ended
      for (int i = 0; i < w.splits; ++i) {
        const KvCachePiece pc = kv_cache_piece(u * w.splits + i, w, grid, positions, block_n, seqlen_q, band);
        CHECK(pc.tile.m_block == t.m_block && pc.tile.head == t.head && pc.tile.batch == t.batch &&
              pc.seqlen_k == first.seqlen_k)
            << "piece " << i << " of tile " << u << " is of another tile";
        CHECK(pc.n_tiles >= 0 && pc.n_end - pc.n_tiles == covered)
            << "piece " << i << " starts at " << pc.n_end - pc.n_tiles << ", want " << covered;
        covered = pc.n_end;
      }
      CHECK(covered == want.end) << "the pieces end at " << covered << ", the tile's range at " << want.end;
    }
    for (int u = 0; u < tiles; ++u) CHECK(seen[u] == 1) << "tile " << u << " met " << seen[u] << " times";
  }
}

// Issue 18: in the batch-invariant mode a tile's pieces are chunks of its own key range, fixed
// by that range alone: the same non-empty pieces, in the same order, whatever the launch's split
// count (the batch's longest sequence sets it), then empty ones; and the launch's count always
// has room for every tile's chunks up to the capacity.
TEST(kvcache_invariant_pieces_depend_on_the_tile_alone) {
  using namespace warpattn::detail;
  std::mt19937_64 rng(18);
  for (int trial = 0; trial < 400; ++trial) {
    const bool causal = trial % 2 == 1;
    const int block_n = trial % 3 == 0 ? 80 : 128, positions = 1 << (rng() % 6);
    const int seqlen_q = 1 + static_cast<int>(rng() % 40);
    const int len = static_cast<int>(rng() % (trial % 5 == 0 ? 400000 : 20000));
    const int chunk_keys = invariant_chunk_keys(1 + static_cast<int>(rng() % 128));
    const int max_chunks = invariant_max_chunks(1 + static_cast<int>(rng() % (trial % 4 == 0 ? 2 : 300)));
    const KeyBand band = causal_band(causal);
    // The sequence alone (capacity: its length) and inside launches of larger capacities.
    std::vector<std::vector<std::pair<int, int>>> seen;
    for (int capacity : {len, len + 1, len + 5000, len + 300000}) {
      if (capacity < 1) continue;
      const int lens[1] = {len};
      KvCacheWork w;
      w.cache_seqlens = lens, w.capacity = capacity, w.chunk_keys = chunk_keys, w.max_chunks = max_chunks;
      w.splits = invariant_launch_splits((capacity + block_n - 1) / block_n, block_n, chunk_keys, max_chunks);
      CHECK(w.splits >= 1 && w.splits <= max_chunks) << w.splits;
      const TileGrid grid{(seqlen_q + positions - 1) / positions, 1, 1, 1};
      for (int m = 0; m < grid.m_blocks; ++m) {
        const int u = m;  // one chunk of heads, one sequence: tile u is block u
        const KvCachePiece first = kv_cache_piece(u * w.splits, w, grid, positions, block_n, seqlen_q, band);
        const KeyTileRange want = kv_tile_range(first.tile.m_block, positions, block_n, seqlen_q, len, band);
        std::vector<std::pair<int, int>> pieces;
        int covered = want.begin;
        bool empty_seen = false;
        for (int i = 0; i < w.splits; ++i) {
          const KvCachePiece pc = kv_cache_piece(u * w.splits + i, w, grid, positions, block_n, seqlen_q, band);
          CHECK(pc.n_tiles >= 0 && pc.n_end - pc.n_tiles == covered) << "piece " << i << " of block " << m;
          covered = pc.n_end;
          if (pc.n_tiles == 0) {
            empty_seen = true;
          } else {
            CHECK(!empty_seen) << "a non-empty piece after an empty one, piece " << i;
            pieces.push_back({pc.n_end - pc.n_tiles, pc.n_end});
          }
        }
        CHECK(covered == want.end) << "the pieces end at " << covered << ", the range at " << want.end << ", capacity "
                                   << capacity << ", len " << len;
        if (seen.size() <= static_cast<size_t>(m)) seen.resize(m + 1);
        if (seen[m].empty() && pieces.size() > 0 && capacity == len) seen[m] = pieces;
        if (capacity != len && !seen[m].empty())
          CHECK(pieces == seen[m]) << "block " << m << " of a sequence of " << len << " keys is cut differently at capacity "
                                   << capacity;
      }
    }
  }
  // The chunks are 2048 keys, or 64 a real row of a tile past 32 rows, until a tile would pass
  // max_chunks of them: about 128 pieces a sequence, at most kMaxDecodeSplits a tile.
  CHECK(invariant_chunk_keys(1) == 2048 && invariant_chunk_keys(32) == 2048 && invariant_chunk_keys(33) == 2112 &&
        invariant_chunk_keys(128) == 8192);
  CHECK(invariant_max_chunks(1) == kMaxDecodeSplits && invariant_max_chunks(8) == 16 && invariant_max_chunks(9) == 15 &&
        invariant_max_chunks(128) == 1 && invariant_max_chunks(1000) == 1);
  constexpr int kAny = kMaxDecodeSplits;
  CHECK(invariant_chunk_blocks(16, 128, 2048, kAny) == 16 && invariant_chunk_blocks(2048, 128, 2048, kAny) == 16 &&
        invariant_chunk_blocks(2049, 128, 2048, kAny) == 17 && invariant_chunk_blocks(1, 80, 2048, kAny) == 26 &&
        invariant_chunk_blocks(1, 128, 8192, kAny) == 64);
  // B = 1, 64K keys, 8 KV heads (8 tiles): 16 chunks of 4096 keys, not 32 of 2048.
  CHECK(invariant_chunk_blocks(512, 128, 2048, invariant_max_chunks(8)) == 32 &&
        invariant_launch_splits(512, 128, 2048, invariant_max_chunks(8)) == 16);
  CHECK(invariant_launch_splits(16, 128, 2048, kAny) == 1 && invariant_launch_splits(17, 128, 2048, kAny) == 2 &&
        invariant_launch_splits(1 << 20, 128, 2048, kAny) == kMaxDecodeSplits &&
        invariant_launch_splits(128, 128, 8192, kAny) == 2 && invariant_launch_splits(1 << 20, 128, 2048, 1) == 1);
}

TEST(split_key_blocks_is_exact_at_the_largest_counts) {
  using namespace warpattn::detail;
  // Its 32-bit arithmetic against 64-bit, up to the largest key-block count a capacity below
  // 2^31 gives in 80-key blocks, every split count.
  for (int blocks : {0, 1, 7, 1000, ((1 << 30) / 80) * 2 + 1})
    for (int splits = 1; splits <= kMaxDecodeSplits; ++splits)
      for (int i = 0; i < splits; ++i) {
        const KeyBlockRange a = split_key_blocks(i, splits, blocks);
        const long long b = static_cast<long long>(i) * blocks / splits, e = static_cast<long long>(i + 1) * blocks / splits;
        CHECK(a.begin == b && a.end == e) << blocks << " " << splits << " " << i;
      }
}
