// The append of a KV-cache call (warpattn.hpp, KvCache): the new keys and values of each
// sequence written into its cache at rows cache_seqlens[b] .. + S_new, before the attention
// kernel reads them (the same stream orders the two).
#pragma once
#include <cuda_runtime.h>

#include "hopper/decode/kv_pages.hpp"
#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

// k_new, v_new: (B, S_new, Hkv, D / Dv); k_cache, v_cache: dense (B, S_cache, Hkv, D / Dv) or
// paged (pages.table set). A row goes to key cache_seqlens[b] + i (the length clamped to
// [0, capacity]) when that key is below the capacity and its page is inside the cache;
// otherwise it is dropped. Nothing else of the caches is written.
void append_kv(const TensorView& k_new, const TensorView& v_new, const TensorView& k_cache, const TensorView& v_cache,
               const int* cache_seqlens, const KvPages& pages, int capacity, cudaStream_t stream);

// An E4M3 cache's descales (warpattn.hpp, KvCache::k_descale and v_descale): one fp32 per KV
// head each, `stride` elements apart (0: one for every head), fixed for the cache's life.
struct CacheDescales {
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
};

// The append into an E4M3 cache (docs/decode-fp8-cache-design.md; the host's reference is
// src/reference/fp8_cache.hpp): k_new, v_new (B, S_new, Hkv, D) 16-bit; k_cache (pages, page
// rows, Hkv, D) e4m3 and v_cache Vᵀ (pages, Hkv, D, page rows) e4m3, dense (a page per sequence)
// or paged. Each element becomes e4m3(x / its head's descale), rounded to nearest even and
// saturated to +-448: K rows where the 16-bit append writes them, V's at column fp8_vt_column(row)
// of each of its D rows of the page's Vᵀ. The same rows are dropped as by append_kv; nothing
// else of the caches is written.
void append_fp8_kv(const TensorView& k_new, const TensorView& v_new, const TensorView& k_cache,
                   const TensorView& v_cache, const CacheDescales& descales, const int* cache_seqlens,
                   const KvPages& pages, int capacity, cudaStream_t stream);

// The new rows of a call, for a launch that appends them once everything that could still fail
// before the attention (tensor maps, scheduler memory) is in hand, so that a failure writes
// nothing.
struct NewRows {
  TensorView k, v;
};

}  // namespace warpattn::detail
