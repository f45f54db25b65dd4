// The calls of the host tests of warpattn::forward_kvcache, over a 16-bit cache
// (test_kvcache.cpp) and over an E4M3 one (test_kvcache_fp8.cpp). Validation reads only the
// views' shapes, strides and addresses, never the memory, so every tensor is a contiguous view
// at a fake device address of its own, and an overlap rule is checked by moving one address.
// What the two suites share lives here: the call, its sizes, the addresses, every tensor but the
// caches (laid out alike over either cache) and the checks. Each suite keeps its defaults (a
// decode step of one query row over E4M3, four rows over 16 bits) and the caches' dtype and
// layout in its own Spec and make_call.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "api/problem.hpp"
#include "harness.hpp"
#include "warpattn/warpattn.hpp"

namespace kvcache_fixture {

using warpattn::DType;
using warpattn::TensorView;

inline void* fake(uintptr_t address) { return reinterpret_cast<void*>(address); }

// A contiguous view of 1 to 4 dimensions at a fake address.
inline TensorView view(uintptr_t address, DType dtype, std::initializer_list<int64_t> shape) {
  int64_t s[4] = {0, 0, 0, 0};
  int rank = 0;
  for (int64_t x : shape) s[rank++] = x;
  return warpattn::make_contiguous_view(fake(address), dtype, rank, s);
}

// The arguments of one forward_kvcache call.
struct Call {
  TensorView q, out;
  std::optional<TensorView> lse;
  warpattn::KvCache cache;
  warpattn::ForwardOptions options;
};

// Each tensor at its own address, far enough apart for the suites' default sizes (a few MB at
// most). A suite's own tensors (sinks, descales) take the addresses from 0xa0000000 on.
constexpr uintptr_t kQ = 0x10000000, kOut = 0x20000000, kLse = 0x30000000, kKCache = 0x40000000,
                    kVCache = 0x50000000, kKNew = 0x60000000, kVNew = 0x70000000, kSeqlens = 0x80000000,
                    kTable = 0x90000000;

// The sizes of a call, which each suite's Spec extends. The defaults make a valid call over a
// 16-bit cache: four query rows and two to append; test_kvcache_fp8.cpp's Spec changes those
// and the page size (a page of an E4M3 cache holds a multiple of 16 keys).
struct Sizes {
  bool paged = false;
  int64_t batch = 3, seqlen_q = 4, heads_q = 8, heads_kv = 2, head_dim = 128;
  int64_t s_cache = 512;                                   // dense
  int64_t num_pages = 40, page_size = 64, max_pages = 10;  // paged
  int64_t s_new = 2;                                       // 0: no append
  DType dtype = DType::bf16;
};

// All of a call but its caches, whose dtype and layout are each suite's: q and out, (batch,
// seqlen_q, heads_q, head_dim) in the call's dtype; lse, (batch, heads_q, seqlen_q), and the
// sequences' lengths, (batch), where asked for; and the rows to append, k and v (batch, s_new,
// heads_kv, head_dim) in q's dtype, unless s_new is 0.
inline Call call_without_caches(const Sizes& s, bool with_lse, bool with_seqlens) {
  Call c;
  c.q = view(kQ, s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
  c.out = view(kOut, s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
  if (with_lse) c.lse = view(kLse, DType::f32, {s.batch, s.heads_q, s.seqlen_q});
  if (with_seqlens) c.cache.cache_seqlens = view(kSeqlens, DType::s32, {s.batch});
  if (s.s_new > 0) {
    c.cache.k = view(kKNew, s.dtype, {s.batch, s.s_new, s.heads_kv, s.head_dim});
    c.cache.v = view(kVNew, s.dtype, {s.batch, s.s_new, s.heads_kv, s.head_dim});
  }
  return c;
}

// The message of the Error that validating the call throws, or nothing for a valid call
// (EXPECT_REJECTED, expect_rejected.hpp, finds it by argument-dependent lookup on Call).
inline std::optional<std::string> error_of(const Call& c) {
  try {
    warpattn::validate_forward_kvcache(c.q, c.cache, c.out, c.lse, c.options);
  } catch (const warpattn::Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// What the detail validation hands to dispatch (the call must be valid).
inline warpattn::detail::KvCacheCall validated(const Call& c) {
  return warpattn::detail::validate_forward_kvcache(c.q, c.cache, c.out, c.lse, c.options);
}

}  // namespace kvcache_fixture

// A valid call: on failure, the line and what the call was, then the error.
#define EXPECT_ACCEPTED(call, what) \
  CHECK(!error_of(call)) << "line " << __LINE__ << " (" << what << "): " << error_of(call).value_or("")
