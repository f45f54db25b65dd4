// Host side of the forward over KV caches (warpattn.hpp, KvCache): the packed batches' kernel
// (KvCacheConfig) on the pieces of (block of positions, chunk of packed heads, sequence) tiles
// that its producer enumerates (kv_cache_pieces.hpp), the lengths read on the device, q, out and
// lse with their batch axis, the keys loaded from each sequence's pages (kv_pages.hpp), and the
// combine of split keys.
#pragma once

#include <cstdlib>

#include "hopper/decode/append_kv.hpp"
#include "hopper/decode/combine_splits.cuh"
#include "hopper/decode/decode_plan.hpp"
#include "hopper/decode/kv_pages.hpp"
#include "hopper/decode/quantize_cache_q.hpp"
#include "common/stream_memory.hpp"
#include "hopper/dependent_launch.cuh"
#include "hopper/run_forward.cuh"
#include "hopper/tile_shapes.hpp"

namespace warpattn::detail {

// How many pieces a KV-cache launch cuts each tile's keys into: the caller's num_splits (1 ..
// kMaxDecodeSplits), or, for 0, decode_plan.hpp's default from the tiles, the capacity's key
// tiles and the SMs; never so many that the pieces pass 2^31 or their partial states (slot_bytes
// each) kMaxSplitPartialBytes, which a forced count over many tiles would. The batch-invariant
// mode's default cuts each tile into chunks fixed by its own key count and the call's shape
// (chunk_keys: invariant_chunk_keys from the tile rows; max_chunks: invariant_max_chunks from
// the tiles a sequence has), not by the batch's tiles; where those would pass the limits, no
// tile is split (still invariant).
inline constexpr long long kMaxSplitPartialBytes = 1LL << 30;
struct KvCacheSplits {
  int splits;
  int chunk_keys;  // 0: an even cut
  int max_chunks;  // with chunk_keys
};
inline bool kvcache_splits_fit(long long tiles, int splits, size_t slot_bytes) {
  return tiles * splits < (1LL << 31) && tiles * splits * static_cast<long long>(slot_bytes) <= kMaxSplitPartialBytes;
}
inline KvCacheSplits kvcache_splits(int num_splits, long long tiles, long long tiles_per_sequence, int key_tiles,
                                    int block_n, int tile_rows, bool batch_invariant, size_t slot_bytes,
                                    int bandwidth_ctas) {
  if (num_splits == 0 && batch_invariant) {
    const int chunk_keys = invariant_chunk_keys(tile_rows), max_chunks = invariant_max_chunks(tiles_per_sequence);
    const int n = invariant_launch_splits(key_tiles, block_n, chunk_keys, max_chunks);
    return n > 1 && kvcache_splits_fit(tiles, n, slot_bytes) ? KvCacheSplits{n, chunk_keys, max_chunks}
                                                             : KvCacheSplits{1, 0, kMaxDecodeSplits};
  }
  int splits = num_splits > 0 ? num_splits : default_splits(tiles, key_tiles, multiprocessor_count(), bandwidth_ctas);
  while (splits > 1 && !kvcache_splits_fit(tiles, splits, slot_bytes)) --splits;
  return {splits, 0, kMaxDecodeSplits};
}

// WARPATTN_TUNE_KV_EVICT_FIRST: -1 (the default) the rule below, 0 never, 1 always (for an A/B).
#ifndef WARPATTN_TUNE_KV_EVICT_FIRST
#define WARPATTN_TUNE_KV_EVICT_FIRST -1
#endif
// Whether a launch's K / V boxes load under an L2 evict-first policy (decode_plan.hpp's
// cache_evict_first), from the most cache bytes it may read: its sequences' capacity (a paged
// cache's: no more than its pages) in K and V, element_bytes each.
inline bool kvcache_evict_first(const ForwardProblem& p, const KvPages& pages, int element_bytes) {
  if constexpr (WARPATTN_TUNE_KV_EVICT_FIRST >= 0) return WARPATTN_TUNE_KV_EVICT_FIRST == 1;
  long long rows = p.batch * p.seqlen_k;
  if (pages.table != nullptr) rows = std::min(rows, static_cast<long long>(pages.num_pages) * pages.page_size);
  return cache_evict_first(2 * rows * p.heads_kv * p.head_dim * element_bytes, l2_cache_bytes());
}

// An E4M3 cache's step (Cfg::kFp8): its Q quantised per work tile (quantize_cache_q.hpp) into
// memory of the call's own, freed in stream order after the launches that read it.
struct QuantizedCacheQ {
  StreamMemory memory;
  TensorView codes;  // (B, Sq, Hq, D) e4m3, contiguous
  float* descales;   // (B, chunks, blocks of positions), contiguous
  QuantizedCacheQ(const TensorView& q, int chunks, int m_blocks, cudaStream_t stream)
      : memory(code_bytes(q) + static_cast<size_t>(q.shape[0]) * chunks * m_blocks * sizeof(float), stream,
               "forward_kvcache: the FP8 step's quantised q"),
        codes(q),
        descales(reinterpret_cast<float*>(static_cast<char*>(memory.get()) + code_bytes(q))) {
    codes.data = memory.get();
    codes.dtype = DType::e4m3;
    codes.stride[3] = 1;
    codes.stride[2] = q.shape[3];
    codes.stride[1] = q.shape[2] * q.shape[3];
    codes.stride[0] = q.shape[1] * codes.stride[1];
  }
  static size_t code_bytes(const TensorView& q) {  // rounded up to 256 bytes: the descales' alignment
    return (static_cast<size_t>(q.shape[0] * q.shape[1] * q.shape[2] * q.shape[3]) + 255) / 256 * 256;
  }
};

// The descales as the consumers read them (DescaleArray::at(batch, head, block); a KV-cache
// tile's head is its chunk of packed heads, its block of Q rows its block of positions, its key
// blocks any: the cache's descales are one per KV head).
inline void set_cache_descales(ForwardParams& params, const float* q_descales, const CacheDescales& cache) {
  params.q_descale.data = q_descales;
  params.q_descale.stride[0] = static_cast<int64_t>(params.heads_q) * params.m_blocks;
  params.q_descale.stride[1] = params.m_blocks;
  params.q_descale.stride[2] = 1;
  params.k_descale.data = cache.k;
  params.k_descale.stride[0] = 0;
  params.k_descale.stride[1] = cache.k_stride;
  params.k_descale.stride[2] = 0;
  params.v_descale.data = cache.v;
  params.v_descale.stride[0] = 0;
  params.v_descale.stride[1] = cache.v_stride;
  params.v_descale.stride[2] = 0;
}

// q, out: (B, Sq, Hq, D); k_cache, v_cache: dense (B, S_cache, Hkv, D) or paged (num_pages,
// page_size, Hkv, D); lse (B, Hq, Sq). p: batch B, seqlen_q Sq, seqlen_k the capacity (>= 1);
// work: the lengths as validated (splits and pieces are set here); pages as validated (the box
// sizes are set here, from the tile); num_splits as kvcache_splits takes it; append: the new
// rows (or null), written once the tensor maps and the scheduler memory are in hand.
// An E4M3 cache (Cfg::kFp8, fp8: its descales): k_cache e4m3 as above, v_cache its Vᵀ in 16-key
// slices, dense (B, Hkv, S_cache / 16, 16 D) or paged (num_pages, Hkv, page_size / 16, 16 D)
// (decode/fp8_cache_layout.hpp), the keys a multiple of 16; q, out and the new rows 16-bit.
template <class Cfg>
void run_forward_kvcache(const ForwardProblem& p, KvCacheWork work, KvPages pages, int num_splits,
                         const NewRows* append, const TensorView& q, const TensorView& k_cache,
                         const TensorView& v_cache, const TensorView& out, const std::optional<TensorView>& lse,
                         cudaStream_t stream, const CacheDescales* fp8 = nullptr) {
  static_assert(Cfg::kKvCache, "a KvCacheConfig");
  static_assert(Cfg::kBlockM == kvcache_block_m(Cfg::kHeadDim), "validation's GQA packing (c7) is the kernel's");
  pages.box_rows = cache_box_rows(Cfg::kBlockN, pages.table != nullptr ? pages.page_size : 0);
  pages.boxes = Cfg::kBlockN / pages.box_rows;
  pages.l2_evict_first = kvcache_evict_first(p, pages, Cfg::kFp8 ? 1 : 2);
  ForwardParams params = base_forward_params<Cfg>(p, out, lse);
  // GQA packing: a tile's rows are `heads` query heads of one KV head at `positions` positions,
  // so K and V are read once per KV head (and a one-row decode step fills group rows, not one).
  const GqaPacking packing = gqa_packing(params.kv_group, Cfg::kBlockM);
  params.packing = packing;
  params.heads_q /= packing.heads;   // the tiles' head axis: chunks of packed heads
  params.kv_group /= packing.heads;  // chunks per KV head
  params.m_blocks = ceil_div(params.seqlen_q, packing.positions);
  params.kv_pages = pages;
  std::optional<QuantizedCacheQ> q8;
  if constexpr (Cfg::kFp8) q8.emplace(q, params.heads_q, params.m_blocks, stream);
  // An E4M3 cache's K through a 1-byte panel map of one-panel boxes (a box of box_rows keys per
  // panel, as the 16-bit cache's), its Vᵀ in 16-key slices (make_vt_slices_tensor_map).
  const ForwardMaps maps =
      Cfg::kFp8 ? ForwardMaps{make_packed_q_tensor_map(q8->codes, "q", packing.heads, packing.positions,
                                                       Cfg::kSwizzleBytes),
                              make_panel_tensor_map(k_cache, "k_cache", pages.box_rows, 1, Cfg::kSwizzleBytes),
                              make_vt_slices_tensor_map(v_cache, "v_cache", pages.box_rows)}
                : ForwardMaps{make_packed_q_tensor_map(q, "q", packing.heads, packing.positions, Cfg::kSwizzleBytes),
                              make_panel_tensor_map(k_cache, "k_cache", pages.box_rows, Cfg::kPanels, Cfg::kSwizzleBytes),
                              make_panel_tensor_map(v_cache, "v_cache", pages.box_rows, Cfg::kPanels, Cfg::kSwizzleBytes)};
  if constexpr (Cfg::kFp8) set_cache_descales(params, q8->descales, *fp8);
  // Validation keeps the tiles below 2^31 (validate_forward_kvcache).
  const long long tiles = p.batch * static_cast<long long>(params.m_blocks) * params.heads_q;
  // Split keys (flash-decoding): when the tiles cannot fill the SMs, each tile's key range is cut
  // into pieces over CTAs, each leaving its partial state, combined in order afterwards. The
  // pieces are enumerated by the producer itself (kv_cache_pieces.hpp): no plan before the launch.
  // (a tile's real rows: the call's query heads of a KV head at up to `positions` positions)
  const int tile_rows = std::min(params.seqlen_q, packing.positions) * packing.heads;
  // (a sequence's tiles: its blocks of positions x chunks of packed heads, the same for each)
  const long long tiles_per_sequence = static_cast<long long>(params.m_blocks) * params.heads_q;
  const KvCacheSplits splits = kvcache_splits(num_splits, tiles, tiles_per_sequence, ceil_div(params.seqlen_k, Cfg::kBlockN),
                                              Cfg::kBlockN, tile_rows, p.batch_invariant, PartialState<Cfg>::kSlotBytes,
                                              cache_bandwidth_ctas(Cfg::kFp8, Cfg::kStages * (Cfg::kKTileBytes + Cfg::kVTileBytes),
                                                                   tile_rows, memory_bandwidth_gbps()));
  work.splits = splits.splits, work.chunk_keys = splits.chunk_keys, work.max_chunks = splits.max_chunks;
  work.pieces = static_cast<int>(tiles * work.splits);
  params.kv_work = work;
#if WARPATTN_TRACE_KV  // (decode/kv_trace.cuh: a measurement build's timeline buffer)
  if (const char* trace = std::getenv("WARPATTN_KV_TRACE_PTR"))
    params.kv_trace = reinterpret_cast<unsigned long long*>(std::strtoull(trace, nullptr, 0));
#endif
  const bool combined = work.splits > 1;
  SchedulerWorkspace ws(stream, combined ? static_cast<size_t>(work.pieces) * PartialState<Cfg>::kSlotBytes : 0);
  // One persistent CTA a SM at most.
  const int64_t ctas = std::min<int64_t>(work.pieces, multiprocessor_count());
  params.tile_counter = ws.tile_counter();
  params.partials = ws.partials();
  if (append != nullptr) {
    if constexpr (Cfg::kFp8)
      append_fp8_kv(append->k, append->v, k_cache, v_cache, *fp8, work.cache_seqlens, pages, work.capacity, stream);
    else
      append_kv(append->k, append->v, k_cache, v_cache, work.cache_seqlens, pages, work.capacity, stream);
  }
  if constexpr (Cfg::kFp8) quantize_cache_q(q, q8->codes.data, q8->descales, packing, stream);
  // (as the dependent of the kernel before it, the append's, the Q quantisation's or the
  // caller's: forward_kernel.cuh waits for it before reading anything)
  launch_forward_kernel<Cfg>(ctas, maps, params, stream, /*dependent=*/true);
  if (combined) {
    // Scheduled while the attention's last pieces still run (the kernel waits for them itself).
    launch_dependent(combine_kvcache_splits_kernel<Cfg>,
                     dim3(static_cast<unsigned>(tiles), combine_row_groups(Cfg::kConsumerWarpgroups, Cfg::kSharedRows, tile_rows),
                          Cfg::kHeadDim / kCombineSliceCols),
                     dim3(128), 0, stream, "combine_kvcache_splits_kernel: launch failed", params);
  }
}

// Defined in forward_kvcache_<dtype>_d<dim>.cu, one file per dtype and head dim.
template <class Element, int kHeadDim>
void run_forward_kvcache_head_dim(const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages,
                                  int num_splits, const NewRows* append, const TensorView& q,
                                  const TensorView& k_cache, const TensorView& v_cache, const TensorView& out,
                                  const std::optional<TensorView>& lse, cudaStream_t stream);

// One mask kind's launch. (A 64-row decode tile whose two warpgroups took alternate key tiles
// was tried for one-row steps, runs 142-153: 1-3% slower than this tile where it mattered, B = 1
// with 64K keys and B = 64, and equal elsewhere; removed.)
template <class Element, int kHeadDim, bool kBanded>
void run_forward_kvcache_band(const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages, int num_splits,
                              const NewRows* append, const TensorView& q, const TensorView& k_cache,
                              const TensorView& v_cache, const TensorView& out, const std::optional<TensorView>& lse,
                              cudaStream_t stream) {
  run_forward_kvcache<KvCacheConfig<KvCacheForwardConfigFor<Element, kHeadDim, kBanded>>>(
      p, work, pages, num_splits, append, q, k_cache, v_cache, out, lse, stream);
}

}  // namespace warpattn::detail

// The body of each forward_kvcache_<dtype>_d<dim>.cu: banded (causal or a sliding window) and not,
// both in the banded tile's shape (tile_shapes.hpp, KvCacheForwardConfigFor).
#define WARPATTN_FORWARD_KVCACHE_INSTANCE(Element, kHeadDim)                                                   \
  namespace warpattn::detail {                                                                               \
  template <>                                                                                                \
  void run_forward_kvcache_head_dim<Element, kHeadDim>(                                                      \
      const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages, int num_splits,                 \
      const NewRows* append, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,       \
      const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {                    \
    if (p.banded)                                                                                            \
      run_forward_kvcache_band<Element, kHeadDim, true>(p, work, pages, num_splits, append, q, k_cache, v_cache, \
                                                        out, lse, stream);                                   \
    else                                                                                                     \
      run_forward_kvcache_band<Element, kHeadDim, false>(p, work, pages, num_splits, append, q, k_cache,       \
                                                         v_cache, out, lse, stream);                         \
  }                                                                                                          \
  }

namespace warpattn::detail {

// An E4M3 cache's kernels, in forward_kvcache_fp8_d<dim>.cu: q, out and the new rows 16-bit
// (p.dtype, the kernel's output), the caches E4M3 (run_forward_kvcache's layouts).
template <int kHeadDim>
void run_forward_kvcache_fp8_head_dim(const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages,
                                      int num_splits, const NewRows* append, const TensorView& q,
                                      const TensorView& k_cache, const TensorView& v_cache,
                                      const CacheDescales& descales, const TensorView& out,
                                      const std::optional<TensorView>& lse, cudaStream_t stream);

template <int kHeadDim, bool kBanded, class Out>
void run_forward_kvcache_fp8_band(const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages,
                                  int num_splits, const NewRows* append, const TensorView& q,
                                  const TensorView& k_cache, const TensorView& v_cache, const CacheDescales& descales,
                                  const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {
  run_forward_kvcache<KvCacheConfig<Fp8ForwardConfigFor<kHeadDim, kBanded, Out, __nv_fp8_e4m3>>>(
      p, work, pages, num_splits, append, q, k_cache, v_cache, out, lse, stream, &descales);
}

}  // namespace warpattn::detail

// The body of each forward_kvcache_fp8_d<dim>.cu: banded and not, bf16 and fp16 output.
#define WARPATTN_FORWARD_KVCACHE_FP8_INSTANCE(kHeadDim)                                                        \
  namespace warpattn::detail {                                                                               \
  template <>                                                                                                \
  void run_forward_kvcache_fp8_head_dim<kHeadDim>(                                                           \
      const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages, int num_splits,                 \
      const NewRows* append, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,       \
      const CacheDescales& descales, const TensorView& out, const std::optional<TensorView>& lse,            \
      cudaStream_t stream) {                                                                                 \
    const auto run = [&](auto banded, auto out_type) {                                                       \
      run_forward_kvcache_fp8_band<kHeadDim, decltype(banded)::value, decltype(out_type)>(                   \
          p, work, pages, num_splits, append, q, k_cache, v_cache, descales, out, lse, stream);              \
    };                                                                                                       \
    if (p.dtype == DType::bf16) {                                                                            \
      if (p.banded) run(std::true_type{}, __nv_bfloat16{});                                                  \
      else run(std::false_type{}, __nv_bfloat16{});                                                          \
    } else {                                                                                                 \
      if (p.banded) run(std::true_type{}, __half{});                                                         \
      else run(std::false_type{}, __half{});                                                                 \
    }                                                                                                        \
  }                                                                                                          \
  }
