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
      {{"q", &q},
       {"k", &k},
       {"v", &v},
       {"out", &out},
       {"lse", lse ? &*lse : nullptr},
       {"sinks", options.sinks ? &*options.sinks : nullptr}},
      stream);
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

void forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const std::optional<TensorView>& lse, const VarlenBatch& batch, const ForwardOptions& options,
                    cudaStream_t stream) {
  const detail::VarlenCall c = detail::validate_forward_varlen(q, k, v, out, lse, batch, options);
  const detail::ForwardProblem& p = c.problem;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return;  // nothing to compute
  const detail::DeviceScope on_device({{"q", &q},
                                       {"k", &k},
                                       {"v", &v},
                                       {"out", &out},
                                       {"lse", lse ? &*lse : nullptr},
                                       {"cu_seqlens_q", &batch.cu_seqlens_q},
                                       {"cu_seqlens_k", &batch.cu_seqlens_k},
                                       {"seqused_k", batch.seqused_k ? &*batch.seqused_k : nullptr},
                                       {"sinks", options.sinks ? &*options.sinks : nullptr}},
                                      stream);
  if (p.seqlen_k == 0)  // no sequence has a key: every row's out is zero and lse -inf
    detail::fill_no_key_rows(p, c.out, c.lse, stream);
  else
    detail::launch_forward_varlen_sm90(p, c.seqs, c.q, c.k, c.v, c.out, c.lse, stream);
}

void validate_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const std::optional<TensorView>& lse, const VarlenBatch& batch,
                             const ForwardOptions& options) {
  detail::validate_forward_varlen(q, k, v, out, lse, batch, options);
}

}  // namespace warpattn
