// PLACEHOLDER while the kernel is written (session 9): the workspace size is real, the launch
// throws.
#include "api/problem.hpp"
#include "hopper/backward/launch_backward.hpp"
#include "hopper/backward/workspace.hpp"

namespace warpattn::detail {

size_t backward_workspace_bytes_sm90(const BackwardProblem& p) {
  return static_cast<size_t>(
      BackwardWorkspaceLayout(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.deterministic).bytes);
}

void launch_backward_sm90(const BackwardProblem&, const BackwardTensors&, void*, cudaStream_t) {
  throw Error("backward: the Hopper kernel is not built yet");
}

}  // namespace warpattn::detail
