// Forward kernels for __nv_bfloat16, head dim 64, causal and not.
#include "hopper/run_forward.cuh"
#include "hopper/tile_shapes.hpp"

namespace warpattn::detail {

template <>
void run_forward_head_dim<__nv_bfloat16, 64>(const ForwardProblem& p, const TensorView& q,
                                      const TensorView& k, const TensorView& v,
                                      const TensorView& out, const std::optional<TensorView>& lse,
                                      cudaStream_t stream) {
  if (p.causal)
    run_forward<ForwardConfigFor<__nv_bfloat16, 64, true>>(p, q, k, v, out, lse, stream);
  else
    run_forward<ForwardConfigFor<__nv_bfloat16, 64, false>>(p, q, k, v, out, lse, stream);
}

}  // namespace warpattn::detail
