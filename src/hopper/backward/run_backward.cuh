// Host side of one backward instantiation: the three launches.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "api/problem.hpp"
#include "hopper/backward/backward_config.hpp"
#include "hopper/backward/backward_kernel.cuh"
#include "hopper/backward/dq_accum.cuh"
#include "hopper/backward/row_terms.cuh"
#include "hopper/backward/workspace.hpp"
#include "hopper/cuda_check.hpp"
#include "hopper/kv_tiles.hpp"
#include "hopper/launch.hpp"
#include "hopper/tensor_map.hpp"

namespace warpattn::detail {

inline RowsView rows_view(const TensorView& t) {
  return {t.data, t.stride[0], t.stride[1], t.stride[2]};
}

template <class Cfg>
void run_backward(const BackwardProblem& pr, const BackwardTensors& t, void* workspace, cudaStream_t stream) {
  using Element = typename Cfg::Element;
  const BackwardWorkspaceLayout layout(pr.batch, pr.heads_q, pr.seqlen_q, pr.head_dim, pr.deterministic);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  BackwardParams p;
  p.dout = rows_view(t.dout);
  p.out = rows_view(t.out);
  p.dq = rows_view(t.dq);
  p.dk = rows_view(t.dk);
  p.dv = rows_view(t.dv);
  p.lse = static_cast<const float*>(t.lse.data);
  p.lse_stride_batch = t.lse.stride[0];
  p.lse_stride_head = t.lse.stride[1];
  p.lse_stride_row = t.lse.stride[2];
  p.dq_accum = reinterpret_cast<float*>(ws + layout.dq_accum);
  p.row_d = reinterpret_cast<float*>(ws + layout.row_d);
  p.lse_log2 = reinterpret_cast<float*>(ws + layout.lse_log2);
  p.turns = pr.deterministic ? reinterpret_cast<int*>(ws + layout.turns) : nullptr;
  p.batch = static_cast<int>(pr.batch);
  p.heads_q = static_cast<int>(pr.heads_q);
  p.heads_kv = static_cast<int>(pr.heads_kv);
  p.seqlen_q = static_cast<int>(pr.seqlen_q);
  p.seqlen_k = static_cast<int>(pr.seqlen_k);
  p.rows = static_cast<int>(layout.rows);
  p.kv_group = static_cast<int>(pr.heads_q / pr.heads_kv);
  p.softmax_scale = pr.softmax_scale;
  p.scale_log2 = static_cast<float>(pr.softmax_scale * 1.4426950408889634);

  if (pr.seqlen_q == 0) {  // no query row: no gradient reaches K or V (and Q has no map)
    zero_rows(t.dk, stream);
    zero_rows(t.dv, stream);
    return;
  }
  const dim3 row_grid(static_cast<unsigned>(layout.rows / 64), p.heads_q, p.batch);
  if (layout.rows > 0) {
    backward_row_terms_kernel<Element, Cfg::kHeadDim><<<row_grid, 256, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "backward_row_terms_kernel: launch failed");
  }
  const int n_blocks = ceil_div(p.seqlen_k, Cfg::kBlockN);
  if (n_blocks > 0) {
    const CUtensorMap tm_q = make_panel_tensor_map(t.q, "q", Cfg::kBlockM, Cfg::kPanels, 128);
    const CUtensorMap tm_do = make_panel_tensor_map(t.dout, "dout", Cfg::kBlockM, Cfg::kPanels, 128);
    const CUtensorMap tm_k = make_panel_tensor_map(t.k, "k", Cfg::kBlockN, Cfg::kPanels, 128);
    const CUtensorMap tm_v = make_panel_tensor_map(t.v, "v", Cfg::kBlockN, Cfg::kPanels, 128);
    auto kernel = attention_backward_kernel<Cfg>;
    constexpr int kSmem = sizeof(BackwardSharedStorage<Cfg>);
    static_assert(kSmem <= 227 * 1024, "more shared memory than a CTA may have on sm_90");
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "attention_backward_kernel: setting its shared-memory size");
    kernel<<<dim3(n_blocks, p.heads_kv, p.batch), Cfg::kThreads, kSmem, stream>>>(tm_q, tm_k, tm_v, tm_do, p);
    check_cuda(cudaGetLastError(), "attention_backward_kernel: launch failed");
  }
  if (layout.rows > 0) {
    convert_dq_kernel<Element, Cfg::kHeadDim><<<row_grid, 256, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "convert_dq_kernel: launch failed");
  }
}

// Declared here, defined in backward_<dtype>_d<dim>.cu (causal and deterministic chosen inside).
template <class Element, int kHeadDim>
void run_backward_head_dim(const BackwardProblem& p, const BackwardTensors& t, void* workspace, cudaStream_t stream);

}  // namespace warpattn::detail

#define WARPATTN_BACKWARD_INSTANCE(Element, kHeadDim)                                                               \
  namespace warpattn::detail {                                                                                      \
  template <>                                                                                                       \
  void run_backward_head_dim<Element, kHeadDim>(const BackwardProblem& p, const BackwardTensors& t, void* workspace, \
                                                cudaStream_t stream) {                                              \
    if (p.causal) {                                                                                                 \
      if (p.deterministic)                                                                                          \
        run_backward<BackwardConfig<Element, kHeadDim, true, true>>(p, t, workspace, stream);                       \
      else                                                                                                          \
        run_backward<BackwardConfig<Element, kHeadDim, true, false>>(p, t, workspace, stream);                      \
    } else {                                                                                                        \
      if (p.deterministic)                                                                                          \
        run_backward<BackwardConfig<Element, kHeadDim, false, true>>(p, t, workspace, stream);                      \
      else                                                                                                          \
        run_backward<BackwardConfig<Element, kHeadDim, false, false>>(p, t, workspace, stream);                     \
    }                                                                                                               \
  }                                                                                                                 \
  }
