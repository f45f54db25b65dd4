// warpattn::forward: validate, then dispatch. Nothing is launched or written before every
// rule has passed.
#include "api/device_scope.hpp"
#include "api/problem.hpp"
#include "hopper/launch.hpp"

namespace warpattn {

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const std::optional<TensorView>& lse, const ForwardOptions& options,
             cudaStream_t stream) {
  const detail::ForwardProblem p = detail::validate_forward(q, k, v, out, lse, options);
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return;  // nothing to compute
  const detail::DeviceScope on_device(
      {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", lse ? &*lse : nullptr}}, stream);
  if (p.seqlen_k == 0)
    detail::fill_no_key_rows(p, out, lse, stream);
  else
    detail::launch_forward_sm90(p, q, k, v, out, lse, stream);
}

void validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const std::optional<TensorView>& lse,
                      const ForwardOptions& options) {
  detail::validate_forward(q, k, v, out, lse, options);
}

}  // namespace warpattn
