// Dispatch of the backward: dtype x head dim -> one instantiation file.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "api/problem.hpp"
#include "hopper/backward/launch_backward.hpp"
#include "hopper/head_dim_dispatch.hpp"
#include "hopper/backward/run_backward.cuh"
#include "hopper/backward/workspace.hpp"

namespace warpattn::detail {

size_t backward_workspace_bytes_sm90(const BackwardProblem& p) {
  // A packed batch: one batch of padded rows (workspace.hpp); p.seqlen_q is total_q.
  const BackwardWorkspaceLayout layout =
      p.varlen ? BackwardWorkspaceLayout(1, p.heads_q,
                                         varlen_padded_rows(p.seqlen_q, p.batch, backward_row_granule(p.backward_kernel_dim())),
                                         p.backward_kernel_dim(), p.deterministic, p.sinks != nullptr)
               : BackwardWorkspaceLayout(p.batch, p.heads_q, p.seqlen_q, p.backward_kernel_dim(), p.deterministic,
                                         p.sinks != nullptr);
  return static_cast<size_t>(layout.bytes);
}

void launch_backward_sm90(const BackwardProblem& p, const BackwardTensors& t, const VarlenSequences* seqs,
                          void* workspace, cudaStream_t stream) {
  with_16bit_element(p.dtype, [&](auto element) {
    with_backward_head_dim(p.backward_kernel_dim(), [&](auto d) {
      run_backward_head_dim<decltype(element), decltype(d)::value>(p, t, seqs, workspace, stream);
    });
  });
}

}  // namespace warpattn::detail
