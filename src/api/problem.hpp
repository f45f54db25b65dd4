// What validation hands to dispatch: the checked sizes of one forward call.
#pragma once

#include <cstdint>

#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

struct ForwardProblem {
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;
  DType dtype = DType::bf16;
  float softmax_scale = 1.f;  // resolved: the option, or 1/sqrt(head_dim)
  bool causal = false;
  bool has_lse = false;
};

// Checks every rule of the API (see warpattn.hpp) on the host, without touching the GPU.
// Throws Error naming the argument, what was expected and what came.
ForwardProblem validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const std::optional<TensorView>& lse,
                                const ForwardOptions& options);

// Throws Error unless the current CUDA device has compute capability 9.0 (Hopper).
void require_sm90_device();

}  // namespace warpattn::detail
