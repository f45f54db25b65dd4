// The body of each forward_<dtype>_d<dim>.cu: one dtype and head dim, causal and not. One file
// per pair so that builds spread over cores.
#pragma once
#include "hopper/run_forward.cuh"
#include "hopper/tile_shapes.hpp"

#define WARPATTN_FORWARD_INSTANCE(Element, kHeadDim)                                              \
  namespace warpattn::detail {                                                                    \
  template <>                                                                                     \
  void run_forward_head_dim<Element, kHeadDim>(                                                   \
      const ForwardProblem& p, const TensorView& q, const TensorView& k, const TensorView& v,     \
      const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {         \
    if (p.causal)                                                                                 \
      run_forward<ForwardConfigFor<Element, kHeadDim, true>>(p, q, k, v, out, lse, stream);       \
    else                                                                                          \
      run_forward<ForwardConfigFor<Element, kHeadDim, false>>(p, q, k, v, out, lse, stream);      \
  }                                                                                               \
  }
