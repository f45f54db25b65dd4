// Forward kernels for __half, head dim 256, causal and not.
#include "hopper/run_forward.cuh"
#include "hopper/tile_shapes.hpp"

namespace warpattn::detail {

template <>
void run_forward_head_dim<__half, 256>(const ForwardProblem& p, const TensorView& q,
                                      const TensorView& k, const TensorView& v,
                                      const TensorView& out, const std::optional<TensorView>& lse,
                                      cudaStream_t stream) {
  const bool alt = tuning().alt_block_n;  // TEMPORARY: see tuning.hpp
  if (p.causal) {
    if (alt) return run_forward<ForwardConfig<__half, 256, 80, 2, true>>(p, q, k, v, out, lse, stream);
    run_forward<ForwardConfigFor<__half, 256, true>>(p, q, k, v, out, lse, stream);
  } else {
    if (alt) return run_forward<ForwardConfig<__half, 256, 80, 2, false>>(p, q, k, v, out, lse, stream);
    run_forward<ForwardConfigFor<__half, 256, false>>(p, q, k, v, out, lse, stream);
  }
}

}  // namespace warpattn::detail
