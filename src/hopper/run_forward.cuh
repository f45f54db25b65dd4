// Host side of one forward instantiation: tensor maps, launch configuration, launch.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "api/problem.hpp"
#include "hopper/cuda_check.hpp"
#include "hopper/dependent_launch.cuh"
#include "hopper/device_info.hpp"
#include "hopper/forward_kernel.cuh"
#include "hopper/kv_tiles.hpp"
#include "hopper/log2e.hpp"
#include "hopper/tensor_map.hpp"
#include "hopper/scheduler_workspace.hpp"
#include "hopper/split_tail_combine.cuh"
#include "hopper/split_tail.hpp"
#include "hopper/varlen/plan_varlen.hpp"

namespace warpattn::detail {

// The split tail (split_tail.hpp) is taken when each CTA's range is at least this many key
// tiles shorter than a whole tile: the stores, the combine kernel and each piece's ramp cost
// about as much as 7 key tiles at d = 64 (run 59: N = 1024, ranges of 1 of 8 key tiles, -4%;
// 15 saved of 32 at d = 128 N = 4096, +0.8%). WARPATTN_TUNE_SPLIT_TAIL=0 turns it off.
#ifndef WARPATTN_TUNE_SPLIT_TAIL
#define WARPATTN_TUNE_SPLIT_TAIL 8
#endif
inline constexpr int kSplitTailMinSaved = WARPATTN_TUNE_SPLIT_TAIL;

// The tensor maps of one launch: q, k and v (FP8: Vᵀ).
struct ForwardMaps {
  CUtensorMap q, k, v;
};

template <class Cfg>
ForwardMaps make_forward_maps(const TensorView& q, const TensorView& k, const TensorView& v) {
  return {make_panel_tensor_map(q, "q", Cfg::kBlockM, Cfg::kPanels, Cfg::kSwizzleBytes),
          make_panel_tensor_map(k, "k", Cfg::kBlockN, Cfg::kPanels, Cfg::kSwizzleBytes),
          Cfg::kFp8 ? make_vt_tensor_map(v, "vt", Cfg::kBlockN)
                    : make_panel_tensor_map(v, "v", Cfg::kBlockN, Cfg::kVPanels, Cfg::kSwizzleBytes)};
}

// The parameters every launch has: out, lse, heads, scale.
template <class Cfg>
ForwardParams base_forward_params(const ForwardProblem& p, const TensorView& out, const std::optional<TensorView>& lse) {
  ForwardParams params;
  params.out = out.data;
  params.out_stride_batch = out.stride[0];
  params.out_stride_row = out.stride[1];
  params.out_stride_head = out.stride[2];
  if (lse) {
    params.lse = static_cast<float*>(lse->data);
    params.lse_stride_batch = lse->stride[0];
    params.lse_stride_head = lse->stride[1];
    params.lse_stride_row = lse->stride[2];
  }
  params.batch = static_cast<int>(p.batch);
  params.heads_q = static_cast<int>(p.heads_q);
  params.seqlen_q = static_cast<int>(p.seqlen_q);
  params.seqlen_k = static_cast<int>(p.seqlen_k);
  params.head_dim = static_cast<int>(p.value_head_dim());  // O's columns
  params.kv_group = static_cast<int>(p.heads_q / p.heads_kv);
  params.scale_log2 = static_cast<float>(p.softmax_scale * kLog2e);
  params.band = p.band;
  if (p.softcap > 0) {
    params.softcap_ex2 = static_cast<float>(2 * kLog2e * p.softmax_scale / p.softcap);
    params.softcap_log2 = static_cast<float>(p.softcap * kLog2e);
  }
  params.sinks = p.sinks;
  params.sinks_stride = p.sinks_stride;
  return params;
}

// FP8's descales, as the kernel reads them.
inline void set_descales(ForwardParams& params, const Fp8Operands& fp8) {
  const auto descales = [](const TensorView& t) {
    DescaleArray a;
    a.data = static_cast<const float*>(t.data);
    for (int i = 0; i < 3; ++i) a.stride[i] = t.stride[i];
    return a;
  };
  params.q_descale = descales(fp8.q_descale);
  params.k_descale = descales(fp8.k_descale);
  params.v_descale = descales(fp8.v_descale);
}

// dependent: launched as the preceding kernel's programmatic dependent (dependent_launch.cuh;
// only an E4M3 KV cache's, whose kernel waits for its Q quantisation: forward_kernel.cuh).
template <class Cfg>
void launch_forward_kernel(int64_t blocks, const ForwardMaps& maps, const ForwardParams& params, cudaStream_t stream,
                           bool dependent = false) {
  auto kernel = attention_forward_kernel<Cfg>;
  constexpr int kSmem = kForwardSmemBytes<Cfg>;
  static_assert(kSmem <= Cfg::kSharedMemoryLimit, "the kernel's shared memory");
  allow_shared_memory<attention_forward_kernel<Cfg>>(kSmem, "attention_forward_kernel: setting its shared-memory size");
  if (dependent) {
    launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(Cfg::kThreads), kSmem, stream,
                     "attention_forward_kernel: launch failed", maps.q, maps.k, maps.v, params);
    return;
  }
  kernel<<<static_cast<unsigned>(blocks), Cfg::kThreads, kSmem, stream>>>(maps.q, maps.k, maps.v, params);
  check_cuda(cudaGetLastError(), "attention_forward_kernel: launch failed");
}

// For FP8 (Cfg::kFp8) v is the operands' Vᵀ and `fp8` gives the descales.
template <class Cfg>
void run_forward(const ForwardProblem& p, const TensorView& q, const TensorView& k,
                 const TensorView& v, const TensorView& out, const std::optional<TensorView>& lse,
                 cudaStream_t stream, const Fp8Operands* fp8 = nullptr) {
  static_assert(Cfg::kDescaleRows == kFp8BlockRows, "the kernel's descale blocks are the API's");
  const ForwardMaps maps = make_forward_maps<Cfg>(q, k, v);
  ForwardParams params = base_forward_params<Cfg>(p, out, lse);
  if constexpr (Cfg::kFp8) set_descales(params, *fp8);
  params.m_blocks = ceil_div(params.seqlen_q, Cfg::kBlockM);
  params.chunk_heads =
      chunk_heads_for(p.seqlen_k * (p.head_dim + p.value_head_dim()) * Cfg::kElementBytes / params.kv_group,
                      params.m_blocks,
                      static_cast<int>(std::min<int64_t>(p.heads_q * p.batch, std::numeric_limits<int>::max())),
                      l2_cache_bytes(), multiprocessor_count());

  const int64_t tiles = static_cast<int64_t>(params.m_blocks) * p.heads_q * p.batch;
  if (tiles > std::numeric_limits<int>::max())
    throw Error("q: batch x heads x ceil(seqlen_q / 128) = " + std::to_string(tiles) +
                " query blocks exceed 2^31 - 1");
  // Persistent grid: one CTA per SM (the register file holds one), or fewer for small problems.
  const int64_t blocks = std::min<int64_t>(tiles, multiprocessor_count());
  params.split.first_tile = static_cast<int>(tiles);  // every tile whole unless split below
  // More tiles than CTAs: hand them out dynamically (greedy, as the hardware would), and split
  // the last wave's tiles over every CTA where that saves enough (non-causal: all tiles have
  // the same key tiles). The counter is never shared with a launch that may run at the same
  // time, and the partial states are this launch's own (scheduler_workspace.hpp).
  std::optional<SchedulerWorkspace> ws;
  if (blocks < tiles) {
    // (not in the batch-invariant mode: which tiles split depends on the whole batch's count;
    // not with sinks, a term of the denominator the combine does not add; not above d = 256,
    // whose warpgroups hold column halves of the same rows)
    const SplitTail split =
        !Cfg::kCausal && !Cfg::kSplitHeadDim && kSplitTailMinSaved > 0 && !p.batch_invariant && p.sinks == nullptr
            ? plan_split_tail(static_cast<int>(tiles), ceil_div(params.seqlen_k, Cfg::kBlockN),
                              static_cast<int>(blocks), kSplitTailMinSaved)
            : SplitTail{};
    ws.emplace(stream, split.tiles > 0 ? PartialState<Cfg>::bytes(static_cast<int>(blocks)) : 0);
    params.tile_counter = ws->tile_counter();
    if (split.tiles > 0) {
      params.split = split;
      params.partials = ws->partials();
    }
  }

  launch_forward_kernel<Cfg>(blocks, maps, params, stream);
  if constexpr (!Cfg::kCausal && !Cfg::kSplitHeadDim) {
    if (params.split.tiles > 0) {
      combine_split_tail_kernel<Cfg><<<dim3(params.split.tiles, Cfg::kConsumerWarpgroups), 128, 0, stream>>>(params);
      check_cuda(cudaGetLastError(), "combine_split_tail_kernel: launch failed");
    }
  }
}

// A packed variable-length batch (Cfg: a VarlenConfig): q, k, v and out as (1, total, heads,
// head_dim) views, lse as (1, heads, total_q); p's batch is the number of sequences and its
// seqlen_q/k the packed lengths. The plan (varlen/plan_varlen.hpp) is made on the device in
// the same scheduler memory, before the kernel, on the same stream. FP8: v is Vᵀ as a (1, heads,
// head_dim, padded keys) view and `fp8` gives the descales, as (1, heads, padded blocks) views.
template <class Cfg>
void run_forward_varlen(const ForwardProblem& p, const VarlenSequences& seqs, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out,
                        const std::optional<TensorView>& lse, cudaStream_t stream, const Fp8Operands* fp8 = nullptr) {
  static_assert(Cfg::kVarlen, "a VarlenConfig");
  const ForwardMaps maps = make_forward_maps<Cfg>(q, k, v);
  ForwardParams params = base_forward_params<Cfg>(p, out, lse);
  params.out_stride_batch = 0;  // rows are indexed from each sequence's offset
  params.lse_stride_batch = 0;
  if constexpr (Cfg::kFp8) {
    set_descales(params, *fp8);
    params.q_descale.stride[0] = params.k_descale.stride[0] = params.v_descale.stride[0] = 0;
  }
  VarlenGeometry g = varlen_geometry(Cfg::kBlockM, Cfg::kBlockN, params.heads_q, params.kv_group, Cfg::kCausal);
  if constexpr (Cfg::kCausal) g.band = params.band;
  g.kv_bytes_per_key = (p.head_dim + p.value_head_dim()) * Cfg::kElementBytes;
  g.l2_bytes = l2_cache_bytes();
  g.multiprocessors = multiprocessor_count();
  // Validation bounds the table below 2^31 entries (validate_forward_varlen).
  const long long max_tiles = max_varlen_tiles(p.seqlen_q, p.batch, Cfg::kBlockM, params.heads_q);
  SchedulerWorkspace ws(stream, varlen_plan_bytes(params.batch, max_tiles));
  const VarlenPlan plan = plan_varlen_tiles(seqs, g, max_tiles, ws.partials(), stream);
  params.varlen_tiles = plan.tiles;
  params.varlen_tile_count = plan.tile_count;
  params.tile_counter = ws.tile_counter();
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(max_tiles, multiprocessor_count()));
  launch_forward_kernel<Cfg>(blocks, maps, params, stream);
}

// Declared here, defined (explicitly instantiated) in forward_<dtype>_d<dim>.cu, one file per
// dtype and head dim so that builds spread over cores.
template <class Element, int kHeadDim>
void run_forward_head_dim(const ForwardProblem& p, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& out,
                          const std::optional<TensorView>& lse, cudaStream_t stream);

// FP8, in forward_fp8_d<dim>.cu (QKElement e4m3) and forward_fp8_int8qk_d<dim>.cu (int8_t):
// p.dtype is the output's dtype.
// Packed variable-length batches, in the same files (run_forward_varlen).
template <class Element, int kHeadDim>
void run_forward_varlen_head_dim(const ForwardProblem& p, const VarlenSequences& seqs, const TensorView& q,
                                 const TensorView& k, const TensorView& v, const TensorView& out,
                                 const std::optional<TensorView>& lse, cudaStream_t stream);

template <int kHeadDim, class QKElement>
void run_forward_fp8_head_dim(const ForwardProblem& p, const Fp8Operands& fp8, const TensorView& out,
                              const std::optional<TensorView>& lse, cudaStream_t stream);

// FP8 on a packed batch, in the same files: fp8's tensors as the (1, ...) views run_forward_varlen
// takes.
template <int kHeadDim, class QKElement>
void run_forward_fp8_varlen_head_dim(const ForwardProblem& p, const VarlenSequences& seqs, const Fp8Operands& fp8,
                                     const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream);

}  // namespace warpattn::detail
