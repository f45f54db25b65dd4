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
#include "hopper/device_info.hpp"
#include "hopper/forward_kernel.cuh"
#include "hopper/kv_tiles.hpp"
#include "hopper/tensor_map.hpp"
#include "hopper/scheduler_workspace.hpp"
#include "hopper/split_tail_combine.cuh"
#include "hopper/split_tail.hpp"

namespace warpattn::detail {

// The split tail (split_tail.hpp) is taken when each CTA's range is at least this many key
// tiles shorter than a whole tile: the stores, the combine kernel and each piece's ramp cost
// about as much as 7 key tiles at d = 64 (run 59: N = 1024, ranges of 1 of 8 key tiles, -4%;
// 15 saved of 32 at d = 128 N = 4096, +0.8%). WARPATTN_TUNE_SPLIT_TAIL=0 turns it off.
#ifndef WARPATTN_TUNE_SPLIT_TAIL
#define WARPATTN_TUNE_SPLIT_TAIL 8
#endif
inline constexpr int kSplitTailMinSaved = WARPATTN_TUNE_SPLIT_TAIL;

// For FP8 (Cfg::kFp8) v is the operands' Vᵀ and `fp8` gives the descales.
template <class Cfg>
void run_forward(const ForwardProblem& p, const TensorView& q, const TensorView& k,
                 const TensorView& v, const TensorView& out, const std::optional<TensorView>& lse,
                 cudaStream_t stream, const Fp8Operands* fp8 = nullptr) {
  static_assert(Cfg::kDescaleRows == kFp8BlockRows, "the kernel's descale blocks are the API's");
  const CUtensorMap tm_q = make_panel_tensor_map(q, "q", Cfg::kBlockM, Cfg::kPanels, Cfg::kSwizzleBytes);
  const CUtensorMap tm_k = make_panel_tensor_map(k, "k", Cfg::kBlockN, Cfg::kPanels, Cfg::kSwizzleBytes);
  const CUtensorMap tm_v = Cfg::kFp8 ? make_vt_tensor_map(v, "vt", Cfg::kBlockN)
                                     : make_panel_tensor_map(v, "v", Cfg::kBlockN, Cfg::kPanels, Cfg::kSwizzleBytes);
  ForwardParams params;
  if constexpr (Cfg::kFp8) {
    const auto descales = [](const TensorView& t) {
      DescaleArray a;
      a.data = static_cast<const float*>(t.data);
      for (int i = 0; i < 3; ++i) a.stride[i] = t.stride[i];
      return a;
    };
    params.q_descale = descales(fp8->q_descale);
    params.k_descale = descales(fp8->k_descale);
    params.v_descale = descales(fp8->v_descale);
  }
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
  params.kv_group = static_cast<int>(p.heads_q / p.heads_kv);
  params.m_blocks = ceil_div(params.seqlen_q, Cfg::kBlockM);
  // Half of L2 for the K and V of the (batch, head) pairs in flight; query heads of one GQA
  // group share theirs.
  const int64_t kv_bytes_per_query_head =
      std::max<int64_t>(1, 2 * p.seqlen_k * p.head_dim * Cfg::kElementBytes / params.kv_group);
  int64_t chunk = l2_cache_bytes() / 2 / kv_bytes_per_query_head;
  // And no more pairs than one wave of CTAs covers, so each pair's K/V is read by all of its
  // query blocks at about the same time (run 18: +4-10% at N <= 1024 non-causal).
  chunk = std::min<int64_t>(chunk, ceil_div(multiprocessor_count(), params.m_blocks));
  params.chunk_heads = static_cast<int>(std::clamp<int64_t>(chunk, 1, p.heads_q * p.batch));
  params.scale_log2 = static_cast<float>(p.softmax_scale * 1.4426950408889634);

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
    const SplitTail split =
        !Cfg::kCausal && kSplitTailMinSaved > 0
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

  auto kernel = attention_forward_kernel<Cfg>;
  constexpr int kSmem = sizeof(SharedStorage<Cfg>);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "attention_forward_kernel: setting its shared-memory size");
  kernel<<<static_cast<unsigned>(blocks), Cfg::kThreads, kSmem, stream>>>(tm_q, tm_k, tm_v, params);
  check_cuda(cudaGetLastError(), "attention_forward_kernel: launch failed");
  if constexpr (!Cfg::kCausal) {
    if (params.split.tiles > 0) {
      combine_split_tail_kernel<Cfg><<<dim3(params.split.tiles, Cfg::kConsumerWarpgroups), 128, 0, stream>>>(params);
      check_cuda(cudaGetLastError(), "combine_split_tail_kernel: launch failed");
    }
  }
}

// Declared here, defined (explicitly instantiated) in forward_<dtype>_d<dim>.cu, one file per
// dtype and head dim so that builds spread over cores.
template <class Element, int kHeadDim>
void run_forward_head_dim(const ForwardProblem& p, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& out,
                          const std::optional<TensorView>& lse, cudaStream_t stream);

// FP8, in forward_fp8_d<dim>.cu (QKElement e4m3) and forward_fp8_int8qk_d<dim>.cu (int8_t):
// p.dtype is the output's dtype.
template <int kHeadDim, class QKElement>
void run_forward_fp8_head_dim(const ForwardProblem& p, const Fp8Operands& fp8, const TensorView& out,
                              const std::optional<TensorView>& lse, cudaStream_t stream);

}  // namespace warpattn::detail
