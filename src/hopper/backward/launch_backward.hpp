// The host side of the Hopper backward: preprocess, main kernel, postprocess.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "api/problem.hpp"

namespace warpattn::detail {

// Bytes of workspace (backward/workspace.hpp) a problem needs; depends on batch, heads_q,
// seqlen_q, head_dim, deterministic and varlen only.
size_t backward_workspace_bytes_sm90(const BackwardProblem& p);

// Runs the backward of a validated problem on the current device (batch, heads >= 1; seqlen_q
// or seqlen_k may be 0: then dk/dv, or dq, come out zero). `workspace`: at least
// backward_workspace_bytes_sm90(p) bytes, 256-byte aligned. seqs: a packed batch's offsets (t's
// tensors then (1, total, heads, head_dim) views), or null.
void launch_backward_sm90(const BackwardProblem& p, const BackwardTensors& t, const VarlenSequences* seqs,
                          void* workspace, cudaStream_t stream);

}  // namespace warpattn::detail
