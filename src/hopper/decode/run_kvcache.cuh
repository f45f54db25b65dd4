// Host side of the forward over KV caches (warpattn.hpp, KvCache): the packed batches' kernel
// (KvCacheConfig) on a plan of (sequence, query head, query block) tiles whose lengths come
// from the device, q, out and lse with their batch axis, the keys loaded from each sequence's
// pages (kv_pages.hpp).
#pragma once

#include "hopper/decode/kv_pages.hpp"
#include "hopper/run_forward.cuh"
#include "hopper/tile_shapes.hpp"

namespace warpattn::detail {

// q, out: (B, Sq, Hq, D); k_cache, v_cache: dense (B, S_cache, Hkv, D) or paged (num_pages,
// page_size, Hkv, D); lse (B, Hq, Sq). p: batch B, seqlen_q Sq, seqlen_k the capacity (>= 1);
// seqs in the KV-cache form; pages as validated (the box sizes are set here, from the tile).
template <class Cfg>
void run_forward_kvcache(const ForwardProblem& p, const VarlenSequences& seqs, KvPages pages, const TensorView& q,
                         const TensorView& k_cache, const TensorView& v_cache, const TensorView& out,
                         const std::optional<TensorView>& lse, cudaStream_t stream) {
  static_assert(Cfg::kKvCache, "a KvCacheConfig");
  pages.box_rows = cache_box_rows(Cfg::kBlockN, pages.table != nullptr ? pages.page_shift : -1);
  pages.boxes = Cfg::kBlockN / pages.box_rows;
  ForwardParams params = base_forward_params<Cfg>(p, out, lse);
  // GQA packing: a tile's rows are `heads` query heads of one KV head at `positions` positions,
  // so K and V are read once per KV head (and a one-row decode step fills group rows, not one).
  const GqaPacking packing = gqa_packing(params.kv_group, Cfg::kBlockM);
  params.packing = packing;
  params.heads_q /= packing.heads;   // the tiles' head axis: chunks of packed heads
  params.kv_group /= packing.heads;  // chunks per KV head
  params.kv_pages = pages;
  const ForwardMaps maps{make_packed_q_tensor_map(q, "q", packing.heads, packing.positions, Cfg::kSwizzleBytes),
                         make_panel_tensor_map(k_cache, "k_cache", pages.box_rows, Cfg::kPanels, Cfg::kSwizzleBytes),
                         make_panel_tensor_map(v_cache, "v_cache", pages.box_rows, Cfg::kPanels, Cfg::kSwizzleBytes)};
  // Validation keeps the table below 2^31 entries (validate_forward_kvcache).
  const long long max_tiles =
      p.batch * static_cast<long long>(ceil_div(params.seqlen_q, packing.positions)) * params.heads_q;
  launch_planned<Cfg>(p, seqs, maps, params, max_tiles, stream, packing.positions);
}

// Defined in forward_kvcache_<dtype>_d<dim>.cu, one file per dtype and head dim.
template <class Element, int kHeadDim>
void run_forward_kvcache_head_dim(const ForwardProblem& p, const VarlenSequences& seqs, const KvPages& pages,
                                  const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                                  const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream);

}  // namespace warpattn::detail

// The body of each forward_kvcache_<dtype>_d<dim>.cu: the dense forward's tile shapes, banded
// (causal or a sliding window) and not.
#define WARPATTN_FORWARD_KVCACHE_INSTANCE(Element, kHeadDim)                                                        \
  namespace warpattn::detail {                                                                                    \
  template <>                                                                                                     \
  void run_forward_kvcache_head_dim<Element, kHeadDim>(                                                           \
      const ForwardProblem& p, const VarlenSequences& seqs, const KvPages& pages, const TensorView& q,             \
      const TensorView& k_cache, const TensorView& v_cache, const TensorView& out,                                \
      const std::optional<TensorView>& lse, cudaStream_t stream) {                                                \
    if (p.banded)                                                                                                 \
      run_forward_kvcache<KvCacheConfig<ForwardConfigFor<Element, kHeadDim, true>>>(p, seqs, pages, q, k_cache,   \
                                                                                   v_cache, out, lse, stream);    \
    else                                                                                                          \
      run_forward_kvcache<KvCacheConfig<ForwardConfigFor<Element, kHeadDim, false>>>(p, seqs, pages, q, k_cache,  \
                                                                                    v_cache, out, lse, stream);   \
  }                                                                                                               \
  }
