// warpattn::forward_kvcache: validate, append the new rows, then attend. Nothing is launched or
// written before every rule has passed.
#include "api/device_scope.hpp"
#include "api/problem.hpp"
#include "hopper/decode/append_kv.hpp"
#include "hopper/launch.hpp"

namespace warpattn {

void forward_kvcache(const TensorView& q, const KvCache& cache, const TensorView& out,
                     const std::optional<TensorView>& lse, const ForwardOptions& options, cudaStream_t stream) {
  const detail::KvCacheCall c = detail::validate_forward_kvcache(q, cache, out, lse, options);
  const detail::ForwardProblem& p = c.problem;
  const bool appends = c.appended > 0 && p.batch > 0 && p.heads_kv > 0;
  const bool attends = p.batch > 0 && p.seqlen_q > 0 && p.heads_q > 0;
  if (!appends && !attends) return;  // nothing to compute
  const detail::DeviceScope on_device({{"q", &q},
                                       {"k_cache", &cache.k_cache},
                                       {"v_cache", &cache.v_cache},
                                       {"out", &out},
                                       {"lse", lse ? &*lse : nullptr},
                                       {"k", cache.k ? &*cache.k : nullptr},
                                       {"v", cache.v ? &*cache.v : nullptr},
                                       {"cache_seqlens", cache.cache_seqlens ? &*cache.cache_seqlens : nullptr},
                                       {"block_table", cache.block_table ? &*cache.block_table : nullptr},
                                       {"sinks", options.sinks ? &*options.sinks : nullptr},
                                       {"k_descale", cache.k_descale ? &*cache.k_descale : nullptr},
                                       {"v_descale", cache.v_descale ? &*cache.v_descale : nullptr}},
                                      stream);
  const std::optional<detail::NewRows> rows =
      appends && p.seqlen_k > 0 ? std::optional<detail::NewRows>(detail::NewRows{*cache.k, *cache.v}) : std::nullopt;
  detail::CacheDescales descales;  // an E4M3 cache's
  if (c.fp8) {
    descales.k = static_cast<const float*>(cache.k_descale->data);
    descales.k_stride = cache.k_descale->stride[0];
    descales.v = static_cast<const float*>(cache.v_descale->data);
    descales.v_stride = cache.v_descale->stride[0];
  }
  if (attends && p.seqlen_k > 0) {  // the launch appends the rows first
    if (c.fp8)
      detail::launch_forward_kvcache_fp8_sm90(p, c.work, c.pages, c.num_splits, rows ? &*rows : nullptr, q,
                                              cache.k_cache, cache.v_cache, descales, out, lse, stream);
    else
      detail::launch_forward_kvcache_sm90(p, c.work, c.pages, c.num_splits, rows ? &*rows : nullptr, q, cache.k_cache,
                                          cache.v_cache, out, lse, stream);
    return;
  }
  if (rows && c.fp8)
    detail::append_fp8_kv(rows->k, rows->v, cache.k_cache, cache.v_cache, descales, c.work.cache_seqlens, c.pages,
                          static_cast<int>(p.seqlen_k), stream);
  else if (rows)
    detail::append_kv(rows->k, rows->v, cache.k_cache, cache.v_cache, c.work.cache_seqlens, c.pages,
                      static_cast<int>(p.seqlen_k), stream);
  if (attends)  // no cache holds a key: every row's out is zero and lse -inf (or its sink)
    detail::fill_no_key_rows(p, out, lse, stream);
}

void validate_forward_kvcache(const TensorView& q, const KvCache& cache, const TensorView& out,
                              const std::optional<TensorView>& lse, const ForwardOptions& options) {
  detail::validate_forward_kvcache(q, cache, out, lse, options);
}

}  // namespace warpattn
