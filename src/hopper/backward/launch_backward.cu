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
  return static_cast<size_t>(
      BackwardWorkspaceLayout(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.deterministic).bytes);
}

template <class Element>
static void dispatch_head_dim(const BackwardProblem& p, const BackwardTensors& t, void* workspace,
                              cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return run_backward_head_dim<Element, 64>(p, t, workspace, stream);
    case 128: return run_backward_head_dim<Element, 128>(p, t, workspace, stream);
    case 256: return run_backward_head_dim<Element, 256>(p, t, workspace, stream);
  }
  throw Error("q: head dim " + std::to_string(p.head_dim) + " has no backward kernel");  // validated before
}

void launch_backward_sm90(const BackwardProblem& p, const BackwardTensors& t, void* workspace, cudaStream_t stream) {
  if (p.dtype == DType::bf16)
    dispatch_head_dim<__nv_bfloat16>(p, t, workspace, stream);
  else
    dispatch_head_dim<__half>(p, t, workspace, stream);
}

}  // namespace warpattn::detail
