// Dispatch of the backward: dtype x head dim -> one instantiation file.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "api/problem.hpp"
#include "hopper/backward/launch_backward.hpp"
#include "hopper/backward/run_backward.cuh"
#include "hopper/backward/workspace.hpp"

namespace warpattn::detail {

size_t backward_workspace_bytes_sm90(const BackwardProblem& p) {
  // A packed batch: one batch of padded rows (workspace.hpp); p.seqlen_q is total_q.
  const BackwardWorkspaceLayout layout =
      p.varlen ? BackwardWorkspaceLayout(1, p.heads_q, varlen_padded_rows(p.seqlen_q, p.batch), p.head_dim,
                                         p.deterministic)
               : BackwardWorkspaceLayout(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.deterministic);
  return static_cast<size_t>(layout.bytes);
}

template <class Element>
static void dispatch_head_dim(const BackwardProblem& p, const BackwardTensors& t, const VarlenSequences* seqs,
                              void* workspace, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return run_backward_head_dim<Element, 64>(p, t, seqs, workspace, stream);
    case 128: return run_backward_head_dim<Element, 128>(p, t, seqs, workspace, stream);
    case 256: return run_backward_head_dim<Element, 256>(p, t, seqs, workspace, stream);
  }
  throw Error("q: head dim " + std::to_string(p.head_dim) + " has no backward kernel");  // validated before
}

void launch_backward_sm90(const BackwardProblem& p, const BackwardTensors& t, const VarlenSequences* seqs,
                          void* workspace, cudaStream_t stream) {
  if (p.dtype == DType::bf16)
    dispatch_head_dim<__nv_bfloat16>(p, t, seqs, workspace, stream);
  else
    dispatch_head_dim<__half>(p, t, seqs, workspace, stream);
}

}  // namespace warpattn::detail
