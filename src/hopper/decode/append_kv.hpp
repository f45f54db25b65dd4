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

// The new rows of a call, for a launch that appends them once everything that could still fail
// before the attention (tensor maps, scheduler memory) is in hand, so that a failure writes
// nothing.
struct NewRows {
  TensorView k, v;
};

}  // namespace warpattn::detail
