// warpattn::backward: validate, then dispatch. Nothing is launched or written before every rule
// has passed, and before the call has workspace memory it may use.
#include <optional>
#include <string>
#include <vector>

#include "api/device_scope.hpp"
#include "api/problem.hpp"
#include "common/stream_memory.hpp"
#include "hopper/backward/launch_backward.hpp"
#include "hopper/launch.hpp"
#include "hopper/cuda_check.hpp"

namespace warpattn {
namespace {

// The workspace as a view of its bytes, so that DeviceScope checks that it lives on the
// tensors' device like them; empty (taking no part) when there is nothing to point at.
TensorView bytes_view(const Workspace& w) {
  TensorView v;
  v.data = w.data;
  v.dtype = DType::f32;
  v.rank = 1;
  v.shape[0] = w.data != nullptr ? static_cast<int64_t>(w.bytes / dtype_size(DType::f32)) : 0;
  v.stride[0] = 1;
  return v;
}

// True while `stream` is being captured into a CUDA graph. Asked with the tensors' device
// current: the special handles (0, cudaStreamLegacy, cudaStreamPerThread) name that device's
// streams (as in DeviceScope). The legacy stream is never captured itself; the query fails for it
// (cudaErrorStreamCaptureImplicit) while a blocking stream of the device is, and then so would
// any launch on it, so the Error comes before anything is launched.
bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  detail::check_cuda(cudaStreamIsCapturing(stream, &status), "stream: cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

// The call's memory for the device check: the nine tensors (the caller's views: their memory is
// what counts) and the workspace (or null).
std::vector<detail::NamedView> named_views(const detail::BackwardTensors& t, const TensorView* workspace,
                                           const BackwardOptions& o) {
  return {{"dout", &t.dout},
          {"q", &t.q},
          {"k", &t.k},
          {"v", &t.v},
          {"out", &t.out},
          {"lse", &t.lse},
          {"dq", &t.dq},
          {"dk", &t.dk},
          {"dv", &t.dv},
          {"workspace", workspace},
          {"sinks", o.sinks ? &*o.sinks : nullptr},
          {"dsinks", o.dsinks ? &*o.dsinks : nullptr}};
}

// A call with nothing to compute still owes dsinks its zeros (no row: no gradient).
void zero_dsinks(const detail::BackwardProblem& p, const BackwardOptions& o, cudaStream_t stream) {
  if (p.dsinks == nullptr || p.heads_q == 0) return;
  const detail::DeviceScope on_device({{"sinks", &*o.sinks}, {"dsinks", &*o.dsinks}}, stream);
  detail::zero_floats(p.dsinks, p.heads_q, p.dsinks_stride, stream);
}

// The launches with the caller's workspace, or with one from warpattn's pool in stream order.
// Not under capture: a captured launch's memory would have to be kept for the process's life (the
// graph may replay at any time), and dQ's accumulator is too large for that (hundreds of MB at
// long sequences); the caller's graph can own it instead.
void launch_with_workspace(const detail::BackwardProblem& p, const detail::BackwardTensors& t,
                           const detail::VarlenSequences* seqs, const std::optional<Workspace>& workspace,
                           cudaStream_t stream) {
  if (workspace) {
    detail::launch_backward_sm90(p, t, seqs, workspace->data, stream);
    return;
  }
  const size_t needed = detail::backward_workspace_bytes_sm90(p);
  std::optional<detail::StreamMemory> memory;
  if (needed > 0) {
    if (is_capturing(stream))
      throw Error(std::string("workspace: a backward call captured into a CUDA graph must be given its workspace (") +
                  (p.varlen ? "backward_varlen_workspace_bytes" : "backward_workspace_bytes") + "); it needs " +
                  std::to_string(needed) +
                  " bytes, which warpattn's memory pool cannot lend to a graph that may replay at any time");
    memory.emplace(needed, stream, "backward workspace");
  }
  detail::launch_backward_sm90(p, t, seqs, memory ? memory->get() : nullptr, stream);
}

}  // namespace

void backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const BackwardOptions& options, const std::optional<Workspace>& workspace,
              cudaStream_t stream) {
  const detail::BackwardTensors t{dout, q, k, v, out, lse, dq, dk, dv};
  const detail::BackwardProblem p = detail::validate_backward(t, options, workspace);
  // Nothing to compute when every gradient is empty (dv is shaped as dk): batch or heads 0, or
  // both sequences empty. With one sequence empty the launch still runs: it zeroes dk and dv (no
  // query rows) or dq (no keys).
  if (detail::is_empty(dq) && detail::is_empty(dk)) return zero_dsinks(p, options, stream);
  const TensorView workspace_view = workspace ? bytes_view(*workspace) : TensorView{};
  const std::vector<detail::NamedView> views = named_views(t, workspace ? &workspace_view : nullptr, options);
  const detail::DeviceScope on_device(views, stream);
  launch_with_workspace(p, t, nullptr, workspace, stream);
}

void backward_varlen(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                     const TensorView& dv, const VarlenBatch& batch, const BackwardOptions& options,
                     const std::optional<Workspace>& workspace, cudaStream_t stream) {
  const detail::VarlenBackwardCall c =
      detail::validate_backward_varlen({dout, q, k, v, out, lse, dq, dk, dv}, batch, options, workspace);
  // Nothing to compute without a sequence, a head, or any row at all.
  if (c.problem.batch == 0 || (detail::is_empty(dq) && detail::is_empty(dk))) return zero_dsinks(c.problem, options, stream);
  const TensorView workspace_view = workspace ? bytes_view(*workspace) : TensorView{};
  const detail::BackwardTensors caller{dout, q, k, v, out, lse, dq, dk, dv};  // outlives the views
  std::vector<detail::NamedView> views = named_views(caller, workspace ? &workspace_view : nullptr, options);
  views.insert(views.end(), {{"cu_seqlens_q", &batch.cu_seqlens_q},
                             {"cu_seqlens_k", &batch.cu_seqlens_k},
                             {"seqused_k", batch.seqused_k ? &*batch.seqused_k : nullptr}});
  const detail::DeviceScope on_device(views, stream);
  launch_with_workspace(c.problem, c.t, &c.seqs, workspace, stream);
}

void validate_backward_varlen(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& lse, const TensorView& dq,
                              const TensorView& dk, const TensorView& dv, const VarlenBatch& batch,
                              const BackwardOptions& options, const std::optional<Workspace>& workspace) {
  detail::validate_backward_varlen({dout, q, k, v, out, lse, dq, dk, dv}, batch, options, workspace);
}

size_t backward_varlen_workspace_bytes(const TensorView& q, int64_t batch, const BackwardOptions& options) {
  return detail::backward_varlen_workspace_bytes(q, batch, options);
}

void validate_backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                       const TensorView& dv, const BackwardOptions& options,
                       const std::optional<Workspace>& workspace) {
  detail::validate_backward({dout, q, k, v, out, lse, dq, dk, dv}, options, workspace);
}

size_t backward_workspace_bytes(const TensorView& q, const BackwardOptions& options) {
  return detail::backward_workspace_bytes(q, options);
}

}  // namespace warpattn
