// Forward kernels for __half, head dim 128, causal and not.
#include "hopper/run_forward.cuh"
#include "hopper/tile_shapes.hpp"

namespace warpattn::detail {

template <>
void run_forward_head_dim<__half, 128>(const ForwardProblem& p, const TensorView& q,
                                      const TensorView& k, const TensorView& v,
                                      const TensorView& out, const std::optional<TensorView>& lse,
                                      cudaStream_t stream) {
  if (p.causal)
    run_forward<ForwardConfigFor<__half, 128, true>>(p, q, k, v, out, lse, stream);
  else
    run_forward<ForwardConfigFor<__half, 128, false>>(p, q, k, v, out, lse, stream);
}

}  // namespace warpattn::detail
