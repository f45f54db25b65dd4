// warpattn::quantize_fp8 and warpattn::forward_fp8: validate, then launch. Nothing is launched
// or written before every rule has passed.
#include <cmath>
#include <vector>

#include "api/device_scope.hpp"
#include "api/message.hpp"
#include "api/problem.hpp"
#include "common/fp8_signs.hpp"
#include "common/stream_memory.hpp"
#include "fp8/quantize.hpp"
#include "hopper/cuda_check.hpp"
#include "hopper/launch.hpp"

namespace warpattn {
namespace {

void copy3(int64_t (&dst)[3], const int64_t* src) {
  for (int i = 0; i < 3; ++i) dst[i] = src[i];
}

// One tensor's quantisation: per block in one launch; per tensor in three (each block's amax
// into the descale array, their maximum into *global_amax, then the codes with it).
template <class Params, class Launch>
void run_pass(Params p, const TensorView& descale, const QuantizeOptions& options, float* global_amax,
              cudaStream_t stream, const Launch& launch) {
  if (options.scaling == Fp8Scaling::per_block) {
    p.mode = detail::QuantizeMode::block_amax;
  } else {
    p.mode = detail::QuantizeMode::amax_only;
    launch(p);
    const int64_t n[3] = {descale.shape[0], descale.shape[1], descale.shape[2]};
    const int64_t s[3] = {descale.stride[0], descale.stride[1], descale.stride[2]};
    detail::launch_max_reduce(static_cast<const float*>(descale.data), n, s, global_amax, stream);
    p.mode = detail::QuantizeMode::global_amax;
    p.global_amax = global_amax;
  }
  launch(p);
}

// cu_seqlens: a packed batch's offsets of `sequences` sequences (the tensors then (1, ...)
// views over padded blocks, fp8.hpp), or null.
void quantize_rows(const TensorView& in, const TensorView& out, const TensorView& descale,
                   const QuantizeOptions& options, int head_dim, float* global_amax, cudaStream_t stream,
                   const int* cu_seqlens = nullptr, int sequences = 0) {
  if (detail::is_empty(in)) return;
  detail::QuantizeRowsParams p{};
  p.in = in.data;
  copy3(p.in_stride, in.stride);
  p.out = out.data;
  copy3(p.out_stride, out.stride);
  p.descale = static_cast<float*>(descale.data);
  copy3(p.descale_stride, descale.stride);
  p.seqlen = static_cast<int>(in.shape[1]);
  p.cu_seqlens = cu_seqlens;
  p.sequences = sequences;
  p.int8_codes = out.dtype == DType::s8;
  p.rotate = options.rotate;
  for (int i = 0; i < head_dim; ++i)
    if (fp8_sign_is_negative(options.seed, i)) p.signs[i / 64] |= uint64_t(1) << (i % 64);
  run_pass(p, descale, options, global_amax, stream, [&](const detail::QuantizeRowsParams& params) {
    detail::launch_quantize_rows(in.dtype, head_dim, params, static_cast<int>(descale.shape[2]),
                                 static_cast<int>(in.shape[2]), static_cast<int>(in.shape[0]), stream);
  });
}

void quantize_v(const TensorView& v, const Fp8Operands& f, const QuantizeOptions& options, int head_dim,
                float* global_amax, cudaStream_t stream, const int* cu_seqlens = nullptr, int sequences = 0) {
  if (detail::is_empty(v)) return;
  detail::QuantizeVtParams p{};
  p.in = v.data;
  copy3(p.in_stride, v.stride);
  p.out = f.vt.data;
  copy3(p.out_stride, f.vt.stride);
  p.descale = static_cast<float*>(f.v_descale.data);
  copy3(p.descale_stride, f.v_descale.stride);
  p.seqlen = static_cast<int>(v.shape[1]);
  p.cu_seqlens = cu_seqlens;
  p.sequences = sequences;
  p.padded_keys = f.vt.shape[3];
  for (int i = 0; i < 16; ++i) p.order[i] = kFp8KeyOrder[i];
  run_pass(p, f.v_descale, options, global_amax, stream, [&](const detail::QuantizeVtParams& params) {
    detail::launch_quantize_vt(v.dtype, head_dim, params, static_cast<int>(f.v_descale.shape[2]),
                               static_cast<int>(v.shape[2]), static_cast<int>(v.shape[0]), stream);
  });
}

// Reads a descale array back and checks that every value is finite and > 0: a zero, negative
// or NaN descale would turn the softmax into garbage without any other sign.
void check_descales(const TensorView& t, const char* name, cudaStream_t stream) {
  if (detail::is_empty(t)) return;
  int64_t span = 1;
  for (int i = 0; i < 3; ++i) span += t.stride[i] * (t.shape[i] - 1);
  std::vector<float> host(static_cast<size_t>(span));
  detail::check_cuda(cudaMemcpyAsync(host.data(), t.data, span * sizeof(float), cudaMemcpyDeviceToHost, stream),
                     "forward_fp8: reading the descales back");
  detail::check_cuda(cudaStreamSynchronize(stream), "forward_fp8: reading the descales back");
  for (int64_t a = 0; a < t.shape[0]; ++a)
    for (int64_t b = 0; b < t.shape[1]; ++b)
      for (int64_t c = 0; c < t.shape[2]; ++c) {
        const float x = host[a * t.stride[0] + b * t.stride[1] + c * t.stride[2]];
        if (std::isfinite(x) && x > 0.f) continue;
        detail::Message m;
        m << name << ": every descale must be finite and > 0, got " << x << " at [" << a << ", " << b << ", "
          << c << "]";
        throw Error(m.str());
      }
}

void check_scaling(const QuantizeOptions& options) {
  if (options.scaling == Fp8Scaling::per_block || options.scaling == Fp8Scaling::per_tensor) return;
  detail::Message m;
  m << "options.scaling: expected per_block (0) or per_tensor (1), got " << static_cast<int>(options.scaling);
  throw Error(m.str());
}

// The three tensors' passes (per tensor scaling: one float of scratch each for its amax).
// cu_q, cu_k: a packed batch's offsets, or null.
void quantize_all(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& fp8,
                  const QuantizeOptions& options, int d, cudaStream_t stream, const int* cu_q = nullptr,
                  const int* cu_k = nullptr, int sequences = 0) {
  std::optional<detail::StreamMemory> scratch;
  float* amax = nullptr;
  if (options.scaling == Fp8Scaling::per_tensor) {
    scratch.emplace(3 * sizeof(float), stream, "quantize_fp8");
    amax = static_cast<float*>(scratch->get());
  }
  quantize_rows(q, fp8.q, fp8.q_descale, options, d, amax, stream, cu_q, sequences);
  quantize_rows(k, fp8.k, fp8.k_descale, options, d, amax ? amax + 1 : nullptr, stream, cu_k, sequences);
  quantize_v(v, fp8, options, d, amax ? amax + 2 : nullptr, stream, cu_k, sequences);
}

// The checks and launches after validation, shared by forward_fp8 and forward_fp8_varlen.
void run_forward_fp8(const detail::ForwardProblem& p, const Fp8Operands& fp8, const TensorView& out,
                     const std::optional<TensorView>& lse, cudaStream_t stream, bool check,
                     const detail::VarlenSequences* seqs) {
  if (check) check_descales(fp8.q_descale, "q_descale", stream);
  if (check && p.seqlen_k > 0) {
    check_descales(fp8.k_descale, "k_descale", stream);
    check_descales(fp8.v_descale, "v_descale", stream);
  }
  if (p.seqlen_k == 0)
    detail::fill_no_key_rows(p, out, lse, stream);
  else if (seqs != nullptr)
    detail::launch_forward_fp8_varlen_sm90(p, *seqs, fp8, out, lse, stream);
  else
    detail::launch_forward_fp8_sm90(p, fp8, out, lse, stream);
}

}  // namespace

void quantize_fp8(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& fp8,
                  const QuantizeOptions& options, cudaStream_t stream) {
  const detail::ProblemSizes p = detail::validate_quantize(q, k, v, fp8);
  check_scaling(options);
  if (p.batch == 0) return;
  const detail::DeviceScope on_device({{"q", &q}, {"k", &k}, {"v", &v}, {"fp8.q", &fp8.q}, {"fp8.k", &fp8.k},
                                       {"fp8.vt", &fp8.vt}, {"fp8.q_descale", &fp8.q_descale},
                                       {"fp8.k_descale", &fp8.k_descale}, {"fp8.v_descale", &fp8.v_descale}},
                                      stream);
  quantize_all(q, k, v, fp8, options, static_cast<int>(p.head_dim), stream);
}

void quantize_fp8_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& fp8,
                         const VarlenBatch& batch, const QuantizeOptions& options, cudaStream_t stream) {
  const detail::VarlenFp8Call c = detail::validate_quantize_varlen(q, k, v, fp8, batch);
  check_scaling(options);
  if (c.problem.batch == 0) return;
  const detail::DeviceScope on_device({{"q", &q}, {"k", &k}, {"v", &v}, {"fp8.q", &fp8.q}, {"fp8.k", &fp8.k},
                                       {"fp8.vt", &fp8.vt}, {"fp8.q_descale", &fp8.q_descale},
                                       {"fp8.k_descale", &fp8.k_descale}, {"fp8.v_descale", &fp8.v_descale},
                                       {"cu_seqlens_q", &batch.cu_seqlens_q}, {"cu_seqlens_k", &batch.cu_seqlens_k}},
                                      stream);
  quantize_all(c.q, c.k, c.v, c.f, options, static_cast<int>(c.problem.head_dim), stream, c.seqs.cu_seqlens_q,
               c.seqs.cu_seqlens_k, c.seqs.batch);
}

void forward_fp8(const Fp8Operands& fp8, const TensorView& out, const std::optional<TensorView>& lse,
                 const ForwardOptions& options, cudaStream_t stream, bool check) {
  const detail::ForwardProblem p = detail::validate_forward_fp8(fp8, out, lse, options);
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return;
  const detail::DeviceScope on_device({{"q", &fp8.q}, {"k", &fp8.k}, {"vt", &fp8.vt}, {"q_descale", &fp8.q_descale},
                                       {"k_descale", &fp8.k_descale}, {"v_descale", &fp8.v_descale}, {"out", &out},
                                       {"lse", lse ? &*lse : nullptr},
                                       {"sinks", options.sinks ? &*options.sinks : nullptr}},
                                      stream);
  run_forward_fp8(p, fp8, out, lse, stream, check, nullptr);
}

void forward_fp8_varlen(const Fp8Operands& fp8, const TensorView& out, const std::optional<TensorView>& lse,
                        const VarlenBatch& batch, const ForwardOptions& options, cudaStream_t stream, bool check) {
  const detail::VarlenFp8Call c = detail::validate_forward_fp8_varlen(fp8, out, lse, batch, options);
  const detail::ForwardProblem& p = c.problem;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return;
  const detail::DeviceScope on_device({{"q", &fp8.q}, {"k", &fp8.k}, {"vt", &fp8.vt}, {"q_descale", &fp8.q_descale},
                                       {"k_descale", &fp8.k_descale}, {"v_descale", &fp8.v_descale}, {"out", &out},
                                       {"lse", lse ? &*lse : nullptr}, {"cu_seqlens_q", &batch.cu_seqlens_q},
                                       {"cu_seqlens_k", &batch.cu_seqlens_k},
                                       {"seqused_k", batch.seqused_k ? &*batch.seqused_k : nullptr},
                                       {"sinks", options.sinks ? &*options.sinks : nullptr}},
                                      stream);
  run_forward_fp8(p, c.f, c.out, c.lse, stream, check, &c.seqs);
}

void validate_quantize_fp8_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const Fp8Operands& fp8, const VarlenBatch& batch, const QuantizeOptions& options) {
  detail::validate_quantize_varlen(q, k, v, fp8, batch);
  check_scaling(options);
}

void validate_forward_fp8_varlen(const Fp8Operands& fp8, const TensorView& out, const std::optional<TensorView>& lse,
                                 const VarlenBatch& batch, const ForwardOptions& options) {
  detail::validate_forward_fp8_varlen(fp8, out, lse, batch, options);
}

void validate_quantize_fp8(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& fp8,
                           const QuantizeOptions& options) {
  detail::validate_quantize(q, k, v, fp8);
  check_scaling(options);
}

void validate_forward_fp8(const Fp8Operands& fp8, const TensorView& out, const std::optional<TensorView>& lse,
                          const ForwardOptions& options) {
  detail::validate_forward_fp8(fp8, out, lse, options);
}

}  // namespace warpattn
