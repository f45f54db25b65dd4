// The Python extension: warpattn.forward and warpattn.backward on any DLPack tensor (PyTorch,
// JAX, CuPy, NumPy), without copies. Argument errors come out as ValueError (TypeError for a
// tensor that is not on a CUDA device or has a dtype warpattn does not know), with warpattn's own
// message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "array_arg.hpp"
#include "warpattn/fp8.hpp"
#include "warpattn/warpattn.hpp"

namespace nb = nanobind;

namespace {

// Any device, dtype, shape and strides: PyTorch tensors read from their attributes, anything else
// through DLPack (array_arg.hpp).
using AnyArray = warpattn_py::Array;

// The dtype warpattn calls it, or a TypeError naming the argument and what it takes (`expected`).
warpattn::DType dtype_of(const AnyArray& a, const char* name,
                         const char* expected = "a float16, bfloat16 or float32 tensor") {
  const nb::dlpack::dtype t = a.dtype();
  if (t.bits == 16 && t.lanes == 1) {
    if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float)) return warpattn::DType::f16;
    if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat)) return warpattn::DType::bf16;
  }
  if (t.bits == 32 && t.lanes == 1 && t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float))
    return warpattn::DType::f32;
  throw nb::type_error((std::string(name) + ": expected " + expected + ", got DLPack dtype code " +
                        std::to_string(t.code) + " with " + std::to_string(t.bits) + " bits")
                           .c_str());
}

// A view of `a` as a tensor of `dtype` (nanobind gives strides in elements).
warpattn::TensorView view_as(const AnyArray& a, const char* name, warpattn::DType dtype) {
  if (a.ndim() > 4)
    throw nb::value_error((std::string(name) + ": expected rank 4 (3 for lse and descales), got rank " +
                           std::to_string(a.ndim()))
                              .c_str());
  warpattn::TensorView v;
  v.data = const_cast<void*>(a.data());
  v.dtype = dtype;
  v.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.stride[i] = static_cast<int64_t>(a.stride(i));
  }
  return v;
}

warpattn::TensorView view_of(const AnyArray& a, const char* name) { return view_as(a, name, dtype_of(a, name)); }

// The sequence offsets of packed batches, a KV cache's lengths and block table: int32 only.
warpattn::TensorView int32_view_of(const AnyArray& a, const char* name) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.bits == 32 && t.lanes == 1 && t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int))
    return view_as(a, name, warpattn::DType::s32);
  throw nb::type_error((std::string(name) + ": expected an int32 tensor, got DLPack dtype code " +
                        std::to_string(t.code) + " with " + std::to_string(t.bits) + " bits")
                           .c_str());
}

bool on_cuda(const AnyArray& a) { return a.device_type() == nb::device::cuda::value; }

// FP8 operands travel as uint8 (the Python side views float8_e4m3fn tensors as bytes, since
// not every framework exports FP8 through DLPack): the byte tensors are e4m3. int8 tensors
// are INT8 Q and K (the library checks that only those are).
warpattn::TensorView fp8_view_of(const AnyArray& a, const char* name) {
  const nb::dlpack::dtype t = a.dtype();
  const bool bytes = t.bits == 8 && t.lanes == 1;
  if (bytes && t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt)) return view_as(a, name, warpattn::DType::e4m3);
  if (bytes && t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int)) return view_as(a, name, warpattn::DType::s8);
  throw nb::type_error((std::string(name) + ": expected the bytes of an e4m3 tensor (uint8 view) or int8, got DLPack dtype code " +
                        std::to_string(t.code) + " with " + std::to_string(t.bits) + " bits")
                           .c_str());
}

// The model options of the forward calls (ForwardOptions' sliding window, softcap and sinks), as
// the Python side passes them: keyword arguments after the others, whose defaults change nothing.
struct ModelOptions {
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  std::optional<AnyArray> sinks;
};

// The sinks as the library takes them. Converted like every other tensor: a dtype the binding
// does not know is a TypeError naming sinks (and the one dtype they may have: float64 logits
// are the likely mistake); their shape, dtype and layout are the library's rules (p).
std::optional<warpattn::TensorView> sinks_view(const ModelOptions& model) {
  if (!model.sinks) return std::nullopt;
  return view_as(*model.sinks, "sinks", dtype_of(*model.sinks, "sinks", "a float32 tensor"));
}

warpattn::ForwardOptions forward_options(std::optional<float> softmax_scale, bool causal, bool batch_invariant,
                                         const ModelOptions& model) {
  warpattn::ForwardOptions options;
  options.softmax_scale = softmax_scale;
  options.causal = causal;
  options.batch_invariant = batch_invariant;
  options.window_left = model.window_left;
  options.window_right = model.window_right;
  options.softcap = model.softcap;
  options.sinks = sinks_view(model);
  return options;
}

// The sinks among a call's arrays for require_cuda (nullptr: none given).
const AnyArray* sinks_of(const ModelOptions& model) { return model.sinks ? &*model.sinks : nullptr; }

// The backward's: the forward call's model options, and dsinks, the sinks' gradient the backward
// writes (required with sinks, refused without: the library's rule).
warpattn::BackwardOptions backward_options(std::optional<float> softmax_scale, bool causal, bool deterministic,
                                           const ModelOptions& model, const std::optional<AnyArray>& dsinks) {
  warpattn::BackwardOptions options;
  options.softmax_scale = softmax_scale;
  options.causal = causal;
  options.deterministic = deterministic;
  options.window_left = model.window_left;
  options.window_right = model.window_right;
  options.softcap = model.softcap;
  options.sinks = sinks_view(model);
  if (dsinks) options.dsinks = view_as(*dsinks, "dsinks", dtype_of(*dsinks, "dsinks", "a float32 tensor"));
  return options;
}

std::optional<warpattn::TensorView> optional_view(const std::optional<AnyArray>& a, const char* name) {
  if (!a) return std::nullopt;
  return view_of(*a, name);
}

// The backward's workspace as the library takes it: the bytes of a C-contiguous array of any
// dtype (the Python side allocates uint8), so that its size in bytes is all the memory it spans.
std::optional<warpattn::Workspace> workspace_of(const std::optional<AnyArray>& a) {
  if (!a) return std::nullopt;
  int64_t dense_stride = 1;
  for (size_t i = a->ndim(); i-- > 0;) {
    if (a->shape(i) != 1 && a->stride(i) != dense_stride)
      throw nb::value_error("workspace: expected a contiguous array (its bytes are handed to the library whole)");
    dense_stride *= static_cast<int64_t>(a->shape(i));
  }
  return warpattn::Workspace{const_cast<void*>(a->data()), a->nbytes()};
}

using NamedArrays = std::initializer_list<std::pair<const AnyArray*, const char*>>;

// The first of `arrays` that is not on a CUDA device, or nullptr.
const std::pair<const AnyArray*, const char*>* first_off_cuda(NamedArrays arrays) {
  for (const auto& named : arrays)
    if (named.first && !on_cuda(*named.first)) return &named;
  return nullptr;
}

void require_cuda(NamedArrays arrays) {
  if (const auto* off = first_off_cuda(arrays))
    throw nb::type_error((std::string(off->second) +
                          ": CUDA tensor required (warpattn runs on the GPU), got a tensor on DLPack device type " +
                          std::to_string(off->first->device_type()))
                             .c_str());
}

// Every entry point: the library's argument rules first, wherever the memory lives, so that every
// error is reported the same (and NumPy arrays can test them without a GPU); then the arrays
// must be on a CUDA device; then `launch` runs without the GIL. warpattn::Error is a ValueError.
// `validate` runs only where an array is not on a CUDA device: otherwise require_cuda cannot
// throw, and the launch (each library entry validates with the same function before it writes
// anything) raises the same error, so a call validates once, not twice (issue 16's host cost).
template <class Validate, class Launch>
void checked_launch(Validate validate, NamedArrays arrays, Launch launch) {
  try {
    if (first_off_cuda(arrays) != nullptr) {
      validate();
      require_cuda(arrays);
    }
    nb::gil_scoped_release release;
    launch();
  } catch (const warpattn::Error& e) {
    throw nb::value_error(e.what());
  }
}

warpattn::Fp8Operands fp8_operands(const AnyArray& q, const AnyArray& k, const AnyArray& vt, const AnyArray& qs,
                                   const AnyArray& ks, const AnyArray& vs) {
  warpattn::Fp8Operands f;
  f.q = fp8_view_of(q, "q");
  f.k = fp8_view_of(k, "k");
  f.vt = fp8_view_of(vt, "vt");
  f.q_descale = view_of(qs, "q_descale");
  f.k_descale = view_of(ks, "k_descale");
  f.v_descale = view_of(vs, "v_descale");
  return f;
}

void quantize_fp8(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& fq, const AnyArray& fk,
                  const AnyArray& fvt, const AnyArray& qs, const AnyArray& ks, const AnyArray& vs, bool rotate,
                  uint64_t seed, bool per_tensor, uintptr_t stream) {
  const warpattn::Fp8Operands f = fp8_operands(fq, fk, fvt, qs, ks, vs);
  const warpattn::TensorView vq = view_of(q, "q"), vk = view_of(k, "k"), vv = view_of(v, "v");
  warpattn::QuantizeOptions o;
  o.rotate = rotate;
  o.seed = seed;
  o.scaling = per_tensor ? warpattn::Fp8Scaling::per_tensor : warpattn::Fp8Scaling::per_block;
  checked_launch([&] { warpattn::validate_quantize_fp8(vq, vk, vv, f, o); },
                 {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&fq, "fp8 q"}, {&fk, "fp8 k"}, {&fvt, "vt"}, {&qs, "q_descale"},
                  {&ks, "k_descale"}, {&vs, "v_descale"}},
                 [&] { warpattn::quantize_fp8(vq, vk, vv, f, o, reinterpret_cast<cudaStream_t>(stream)); });
}

void forward_fp8(const AnyArray& fq, const AnyArray& fk, const AnyArray& fvt, const AnyArray& qs, const AnyArray& ks,
                 const AnyArray& vs, const AnyArray& out, const std::optional<AnyArray>& lse,
                 std::optional<float> softmax_scale, bool causal, uintptr_t stream, bool check_descales,
                 int window_left, int window_right, float softcap, const std::optional<AnyArray>& sinks,
                 bool batch_invariant) {
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::Fp8Operands f = fp8_operands(fq, fk, fvt, qs, ks, vs);
  const warpattn::TensorView vo = view_of(out, "out");
  const std::optional<warpattn::TensorView> vl = optional_view(lse, "lse");
  const warpattn::ForwardOptions options = forward_options(softmax_scale, causal, batch_invariant, model);
  checked_launch([&] { warpattn::validate_forward_fp8(f, vo, vl, options); },
                 {{&fq, "q"}, {&fk, "k"}, {&fvt, "vt"}, {&qs, "q_descale"}, {&ks, "k_descale"}, {&vs, "v_descale"},
                  {&out, "out"}, {lse ? &*lse : nullptr, "lse"}, {sinks_of(model), "sinks"}},
                 [&] {
                   warpattn::forward_fp8(f, vo, vl, options, reinterpret_cast<cudaStream_t>(stream), check_descales);
                 });
}

void forward(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& out,
             const std::optional<AnyArray>& lse, std::optional<float> softmax_scale, bool causal,
             uintptr_t stream, bool batch_invariant, int window_left, int window_right, float softcap,
             const std::optional<AnyArray>& sinks) {
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::TensorView vq = view_of(q, "q"), vk = view_of(k, "k"), vv = view_of(v, "v"),
                             vo = view_of(out, "out");
  const std::optional<warpattn::TensorView> vl = optional_view(lse, "lse");
  const warpattn::ForwardOptions options = forward_options(softmax_scale, causal, batch_invariant, model);
  checked_launch([&] { warpattn::validate_forward(vq, vk, vv, vo, vl, options); },
                 {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {lse ? &*lse : nullptr, "lse"},
                  {sinks_of(model), "sinks"}},
                 [&] { warpattn::forward(vq, vk, vv, vo, vl, options, reinterpret_cast<cudaStream_t>(stream)); });
}

warpattn::VarlenBatch varlen_batch(const AnyArray& cu_seqlens_q, const AnyArray& cu_seqlens_k,
                                   const std::optional<AnyArray>& seqused_k, int64_t max_seqlen_q,
                                   int64_t max_seqlen_k) {
  warpattn::VarlenBatch batch;
  batch.cu_seqlens_q = int32_view_of(cu_seqlens_q, "cu_seqlens_q");
  batch.cu_seqlens_k = int32_view_of(cu_seqlens_k, "cu_seqlens_k");
  if (seqused_k) batch.seqused_k = int32_view_of(*seqused_k, "seqused_k");
  batch.max_seqlen_q = max_seqlen_q;
  batch.max_seqlen_k = max_seqlen_k;
  return batch;
}

void forward_varlen(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& out,
                    const std::optional<AnyArray>& lse, const AnyArray& cu_seqlens_q, const AnyArray& cu_seqlens_k,
                    const std::optional<AnyArray>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                    std::optional<float> softmax_scale, bool causal, uintptr_t stream, bool batch_invariant,
                    int window_left, int window_right, float softcap, const std::optional<AnyArray>& sinks) {
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::TensorView vq = view_of(q, "q"), vk = view_of(k, "k"), vv = view_of(v, "v"),
                             vo = view_of(out, "out");
  const std::optional<warpattn::TensorView> vl = optional_view(lse, "lse");
  const warpattn::VarlenBatch batch = varlen_batch(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
  const warpattn::ForwardOptions options = forward_options(softmax_scale, causal, batch_invariant, model);
  checked_launch([&] { warpattn::validate_forward_varlen(vq, vk, vv, vo, vl, batch, options); },
                 {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {lse ? &*lse : nullptr, "lse"},
                  {&cu_seqlens_q, "cu_seqlens_q"}, {&cu_seqlens_k, "cu_seqlens_k"},
                  {seqused_k ? &*seqused_k : nullptr, "seqused_k"}, {sinks_of(model), "sinks"}},
                 [&] { warpattn::forward_varlen(vq, vk, vv, vo, vl, batch, options, reinterpret_cast<cudaStream_t>(stream)); });
}

// The cache of forward_kvcache as the library takes it: k_cache and v_cache dense (batch,
// seqlen, heads_kv, head_dim) or paged (num_pages, page_size, heads_kv, head_dim) with a block
// table; the lengths, the block table and the new keys and values optional.
// An E4M3 cache comes as its bytes (uint8, as every FP8 operand here: fp8_view_of) with its
// (heads_kv) float32 descales; the library's rules say which dtypes go together.
warpattn::KvCache kv_cache(const AnyArray& k_cache, const AnyArray& v_cache, const std::optional<AnyArray>& k,
                           const std::optional<AnyArray>& v, const std::optional<AnyArray>& cache_seqlens,
                           const std::optional<AnyArray>& block_table, const std::optional<AnyArray>& k_descale,
                           const std::optional<AnyArray>& v_descale) {
  const auto cache_view = [](const AnyArray& a, const char* name) {
    return a.dtype().bits == 8 ? fp8_view_of(a, name) : view_of(a, name);
  };
  warpattn::KvCache cache;
  cache.k_cache = cache_view(k_cache, "k_cache");
  cache.v_cache = cache_view(v_cache, "v_cache");
  cache.k = optional_view(k, "k");
  cache.v = optional_view(v, "v");
  if (cache_seqlens) cache.cache_seqlens = int32_view_of(*cache_seqlens, "cache_seqlens");
  if (block_table) cache.block_table = int32_view_of(*block_table, "block_table");
  cache.k_descale = optional_view(k_descale, "k_descale");
  cache.v_descale = optional_view(v_descale, "v_descale");
  return cache;
}

void forward_kvcache(const AnyArray& q, const AnyArray& k_cache, const AnyArray& v_cache, const AnyArray& out,
                     const std::optional<AnyArray>& lse, const std::optional<AnyArray>& k,
                     const std::optional<AnyArray>& v, const std::optional<AnyArray>& cache_seqlens,
                     const std::optional<AnyArray>& block_table, std::optional<float> softmax_scale, bool causal,
                     uintptr_t stream, bool batch_invariant, int window_left, int window_right, float softcap,
                     const std::optional<AnyArray>& sinks, int num_splits, const std::optional<AnyArray>& k_descale,
                     const std::optional<AnyArray>& v_descale) {
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::TensorView vq = view_of(q, "q"), vo = view_of(out, "out");
  const std::optional<warpattn::TensorView> vl = optional_view(lse, "lse");
  warpattn::KvCache cache = kv_cache(k_cache, v_cache, k, v, cache_seqlens, block_table, k_descale, v_descale);
  cache.num_splits = num_splits;
  const warpattn::ForwardOptions options = forward_options(softmax_scale, causal, batch_invariant, model);
  checked_launch([&] { warpattn::validate_forward_kvcache(vq, cache, vo, vl, options); },
                 {{&q, "q"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&out, "out"},
                  {lse ? &*lse : nullptr, "lse"}, {k ? &*k : nullptr, "k"}, {v ? &*v : nullptr, "v"},
                  {cache_seqlens ? &*cache_seqlens : nullptr, "cache_seqlens"},
                  {block_table ? &*block_table : nullptr, "block_table"}, {sinks_of(model), "sinks"},
                  {k_descale ? &*k_descale : nullptr, "k_descale"}, {v_descale ? &*v_descale : nullptr, "v_descale"}},
                 [&] { warpattn::forward_kvcache(vq, cache, vo, vl, options, reinterpret_cast<cudaStream_t>(stream)); });
}

void quantize_fp8_varlen(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& fq,
                         const AnyArray& fk, const AnyArray& fvt, const AnyArray& qs, const AnyArray& ks,
                         const AnyArray& vs, const AnyArray& cu_seqlens_q, const AnyArray& cu_seqlens_k, bool rotate,
                         uint64_t seed, bool per_tensor, uintptr_t stream) {
  const warpattn::Fp8Operands f = fp8_operands(fq, fk, fvt, qs, ks, vs);
  const warpattn::TensorView vq = view_of(q, "q"), vk = view_of(k, "k"), vv = view_of(v, "v");
  const warpattn::VarlenBatch batch = varlen_batch(cu_seqlens_q, cu_seqlens_k, std::nullopt, 0, 0);
  warpattn::QuantizeOptions o;
  o.rotate = rotate;
  o.seed = seed;
  o.scaling = per_tensor ? warpattn::Fp8Scaling::per_tensor : warpattn::Fp8Scaling::per_block;
  checked_launch([&] { warpattn::validate_quantize_fp8_varlen(vq, vk, vv, f, batch, o); },
                 {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&fq, "fp8 q"}, {&fk, "fp8 k"}, {&fvt, "vt"}, {&qs, "q_descale"},
                  {&ks, "k_descale"}, {&vs, "v_descale"}, {&cu_seqlens_q, "cu_seqlens_q"},
                  {&cu_seqlens_k, "cu_seqlens_k"}},
                 [&] { warpattn::quantize_fp8_varlen(vq, vk, vv, f, batch, o, reinterpret_cast<cudaStream_t>(stream)); });
}

void forward_fp8_varlen(const AnyArray& fq, const AnyArray& fk, const AnyArray& fvt, const AnyArray& qs,
                        const AnyArray& ks, const AnyArray& vs, const AnyArray& out, const std::optional<AnyArray>& lse,
                        const AnyArray& cu_seqlens_q, const AnyArray& cu_seqlens_k,
                        const std::optional<AnyArray>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                        std::optional<float> softmax_scale, bool causal, uintptr_t stream, bool check_descales,
                        int window_left, int window_right, float softcap, const std::optional<AnyArray>& sinks,
                        bool batch_invariant) {
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::Fp8Operands f = fp8_operands(fq, fk, fvt, qs, ks, vs);
  const warpattn::TensorView vo = view_of(out, "out");
  const std::optional<warpattn::TensorView> vl = optional_view(lse, "lse");
  const warpattn::VarlenBatch batch = varlen_batch(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
  const warpattn::ForwardOptions options = forward_options(softmax_scale, causal, batch_invariant, model);
  checked_launch([&] { warpattn::validate_forward_fp8_varlen(f, vo, vl, batch, options); },
                 {{&fq, "q"}, {&fk, "k"}, {&fvt, "vt"}, {&qs, "q_descale"}, {&ks, "k_descale"}, {&vs, "v_descale"},
                  {&out, "out"}, {lse ? &*lse : nullptr, "lse"}, {&cu_seqlens_q, "cu_seqlens_q"},
                  {&cu_seqlens_k, "cu_seqlens_k"}, {seqused_k ? &*seqused_k : nullptr, "seqused_k"},
                  {sinks_of(model), "sinks"}},
                 [&] {
                   warpattn::forward_fp8_varlen(f, vo, vl, batch, options, reinterpret_cast<cudaStream_t>(stream),
                                                check_descales);
                 });
}

void backward(const AnyArray& dout, const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& out,
              const AnyArray& lse, const AnyArray& dq, const AnyArray& dk, const AnyArray& dv,
              std::optional<float> softmax_scale, bool causal, bool deterministic,
              const std::optional<AnyArray>& workspace, uintptr_t stream, int window_left, int window_right,
              float softcap, const std::optional<AnyArray>& sinks, const std::optional<AnyArray>& dsinks) {
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::TensorView vdout = view_of(dout, "dout"), vq = view_of(q, "q"), vk = view_of(k, "k"),
                             vv = view_of(v, "v"), vo = view_of(out, "out"), vl = view_of(lse, "lse"),
                             vdq = view_of(dq, "dq"), vdk = view_of(dk, "dk"), vdv = view_of(dv, "dv");
  const std::optional<warpattn::Workspace> w = workspace_of(workspace);
  const warpattn::BackwardOptions options = backward_options(softmax_scale, causal, deterministic, model, dsinks);
  checked_launch([&] { warpattn::validate_backward(vdout, vq, vk, vv, vo, vl, vdq, vdk, vdv, options, w); },
                 {{&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}, {&dq, "dq"},
                  {&dk, "dk"}, {&dv, "dv"}, {workspace ? &*workspace : nullptr, "workspace"},
                  {sinks_of(model), "sinks"}, {dsinks ? &*dsinks : nullptr, "dsinks"}},
                 [&] {
                   warpattn::backward(vdout, vq, vk, vv, vo, vl, vdq, vdk, vdv, options, w,
                                      reinterpret_cast<cudaStream_t>(stream));
                 });
}

void backward_varlen(const AnyArray& dout, const AnyArray& q, const AnyArray& k, const AnyArray& v,
                     const AnyArray& out, const AnyArray& lse, const AnyArray& dq, const AnyArray& dk,
                     const AnyArray& dv, const AnyArray& cu_seqlens_q, const AnyArray& cu_seqlens_k,
                     const std::optional<AnyArray>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                     std::optional<float> softmax_scale, bool causal, bool deterministic,
                     const std::optional<AnyArray>& workspace, uintptr_t stream, int window_left,
                     int window_right, float softcap, const std::optional<AnyArray>& sinks,
                     const std::optional<AnyArray>& dsinks) {
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::TensorView vdout = view_of(dout, "dout"), vq = view_of(q, "q"), vk = view_of(k, "k"),
                             vv = view_of(v, "v"), vo = view_of(out, "out"), vl = view_of(lse, "lse"),
                             vdq = view_of(dq, "dq"), vdk = view_of(dk, "dk"), vdv = view_of(dv, "dv");
  const warpattn::VarlenBatch batch = varlen_batch(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
  const std::optional<warpattn::Workspace> w = workspace_of(workspace);
  const warpattn::BackwardOptions options = backward_options(softmax_scale, causal, deterministic, model, dsinks);
  checked_launch(
      [&] { warpattn::validate_backward_varlen(vdout, vq, vk, vv, vo, vl, vdq, vdk, vdv, batch, options, w); },
      {{&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}, {&dq, "dq"}, {&dk, "dk"},
       {&dv, "dv"}, {&cu_seqlens_q, "cu_seqlens_q"}, {&cu_seqlens_k, "cu_seqlens_k"},
       {seqused_k ? &*seqused_k : nullptr, "seqused_k"}, {workspace ? &*workspace : nullptr, "workspace"},
       {sinks_of(model), "sinks"}, {dsinks ? &*dsinks : nullptr, "dsinks"}},
      [&] {
        warpattn::backward_varlen(vdout, vq, vk, vv, vo, vl, vdq, vdk, vdv, batch, options, w,
                                  reinterpret_cast<cudaStream_t>(stream));
      });
}

size_t backward_varlen_workspace_bytes(const AnyArray& q, int64_t batch, std::optional<float> softmax_scale,
                                       bool causal, bool deterministic, int window_left, int window_right,
                                       float softcap, const std::optional<AnyArray>& sinks,
                                       const std::optional<AnyArray>& dsinks) {
  const warpattn::TensorView vq = view_of(q, "q");
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::BackwardOptions options = backward_options(softmax_scale, causal, deterministic, model, dsinks);
  try {
    return warpattn::backward_varlen_workspace_bytes(vq, batch, options);
  } catch (const warpattn::Error& e) {
    throw nb::value_error(e.what());
  }
}

size_t backward_workspace_bytes(const AnyArray& q, std::optional<float> softmax_scale, bool causal,
                                bool deterministic, int window_left, int window_right, float softcap,
                                const std::optional<AnyArray>& sinks, const std::optional<AnyArray>& dsinks) {
  const warpattn::TensorView vq = view_of(q, "q");
  const ModelOptions model{window_left, window_right, softcap, sinks};
  const warpattn::BackwardOptions options = backward_options(softmax_scale, causal, deterministic, model, dsinks);
  try {
    return warpattn::backward_workspace_bytes(vq, options);
  } catch (const warpattn::Error& e) {
    throw nb::value_error(e.what());
  }
}

// What the binding read of an array (array_arg.hpp), for the tests: (address, DLPack dtype code,
// bits, shape, strides, DLPack device type, whether it came through DLPack).
nb::tuple array_facts(const AnyArray& a) {
  nb::list shape, strides;
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape.append(a.shape(i));
    strides.append(a.stride(i));
  }
  return nb::make_tuple(reinterpret_cast<uintptr_t>(a.data()), a.dtype().code, a.dtype().bits, nb::tuple(shape),
                        nb::tuple(strides), a.device_type(), a.through_dlpack());
}

}  // namespace

NB_MODULE(_warpattn, m) {
  m.doc() = "warpattn: exact attention for NVIDIA Hopper (sm_90a). Use warpattn.flash_attn_func.";
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("stream"),
        nb::arg("batch_invariant") = false, nb::kw_only(), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.0f, nb::arg("sinks").none() = nb::none(),
        "Writes softmax(scale q k^T) v into `out` (and the log-sum-exp into `lse`), on `stream` (a "
        "cudaStream_t as an integer). All tensors in (batch, seqlen, heads, head_dim) layout. window_left, "
        "window_right: a sliding window (-1: unbounded); softcap: softcap * tanh(score / softcap) (0: off); "
        "sinks: (heads,) float32 logits joining each head's softmax denominator, or None (warpattn.hpp, "
        "ForwardOptions).");
  m.def("forward_varlen", &forward_varlen, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("seqused_k").none(),
        nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("softmax_scale").none(), nb::arg("causal"),
        nb::arg("stream"), nb::arg("batch_invariant") = false, nb::kw_only(), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f, nb::arg("sinks").none() = nb::none(),
        "forward on a packed batch: q, out (total_q, heads, head_dim); k, v (total_k, heads_kv, head_dim); lse "
        "(heads, total_q); cu_seqlens_q/k (batch + 1) int32, seqused_k (batch) int32 or None, on the device. "
        "window_left, window_right, softcap, sinks: as forward's, per sequence.");
  m.def("forward_kvcache", &forward_kvcache, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("k").none(), nb::arg("v").none(), nb::arg("cache_seqlens").none(),
        nb::arg("block_table").none(), nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("stream"),
        nb::arg("batch_invariant") = false, nb::kw_only(), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f, nb::arg("sinks").none() = nb::none(),
        nb::arg("num_splits") = 0, nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
        "forward over each sequence's KV cache: q, out (batch, seqlen_q, heads, head_dim); k_cache, v_cache dense "
        "(batch, seqlen_cache, heads_kv, head_dim) or paged (num_pages, page_size, heads_kv, head_dim) with "
        "block_table (batch, max_pages) int32; cache_seqlens (batch) int32 or None (every cache full); k, v "
        "(batch, seqlen_new, heads_kv, head_dim) or None: written into the caches at rows cache_seqlens[b] "
        "onwards before the attention; lse (batch, heads, seqlen_q). window_left, window_right, softcap, sinks: as "
        "forward's, aligned bottom-right on each sequence's keys; num_splits: the pieces of each tile's keys (0: "
        "chosen from the shape; warpattn.hpp, KvCache). k_descale, v_descale: (heads_kv) float32 with an E4M3 cache "
        "(its bytes as uint8; v_cache then V transposed in 16-key slices: (batch, heads_kv, seqlen_cache / 16, 16 x "
        "head_dim) or (num_pages, heads_kv, page_size / 16, 16 x head_dim)), else None.");
  // Every multiple of 8 from 8 to 256 (64, 128 and 256 compiled, those between padded); the dense
  // forward's and the backward's to 512 (a 512 kernel above 256).
  nb::list supported_head_dims, backward_head_dims, forward_head_dims;
  for (int d : warpattn::kSupportedHeadDims) supported_head_dims.append(d);
  for (int d : warpattn::kBackwardHeadDims) backward_head_dims.append(d);
  for (int d : warpattn::kForwardHeadDims) forward_head_dims.append(d);
  m.attr("supported_head_dims") = nb::tuple(supported_head_dims);
  m.attr("backward_head_dims") = nb::tuple(backward_head_dims);
  m.attr("forward_head_dims") = nb::tuple(forward_head_dims);
  m.def("backward", &backward, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("softmax_scale").none(),
        nb::arg("causal"), nb::arg("deterministic"), nb::arg("workspace").none(), nb::arg("stream"),
        nb::kw_only(), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.0f, nb::arg("sinks").none() = nb::none(), nb::arg("dsinks").none() = nb::none(),
        "Writes the gradients of forward(q, k, v) -> out, lse into dq, dk, dv, given dout = dL/d(out), on "
        "`stream`. workspace: a contiguous device array of at least backward_workspace_bytes bytes, 256-byte "
        "aligned (None: taken from warpattn's memory pool, which is refused during CUDA graph capture). "
        "window_left, window_right, softcap, sinks: the forward call's (softcap at every head dim); "
        "dsinks: with sinks, a (heads,) float32 tensor the call writes the sinks' gradient into.");
  m.def("backward_workspace_bytes", &backward_workspace_bytes, nb::arg("q"), nb::arg("softmax_scale").none() = nb::none(),
        nb::arg("causal") = false, nb::arg("deterministic") = false, nb::kw_only(), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f, nb::arg("sinks").none() = nb::none(),
        nb::arg("dsinks").none() = nb::none(),
        "Bytes of workspace backward needs for q's shape and these options (only q's rank and sizes are checked; "
        "sinks need more).");
  m.def("backward_varlen", &backward_varlen, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("seqused_k").none(), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("deterministic"), nb::arg("workspace").none(),
        nb::arg("stream"), nb::kw_only(), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.0f, nb::arg("sinks").none() = nb::none(), nb::arg("dsinks").none() = nb::none(),
        "backward on a packed batch (tensors as forward_varlen takes them; lse (heads, total_q)); workspace: at "
        "least backward_varlen_workspace_bytes bytes, or None. window_left, window_right, softcap, sinks, dsinks: "
        "as backward's.");
  m.def("backward_varlen_workspace_bytes", &backward_varlen_workspace_bytes, nb::arg("q"), nb::arg("batch"),
        nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false, nb::arg("deterministic") = false,
        nb::kw_only(), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.0f, nb::arg("sinks").none() = nb::none(), nb::arg("dsinks").none() = nb::none(),
        "Bytes of workspace backward_varlen needs for q (total_q, heads, head_dim) and `batch` sequences.");
  m.def("quantize_fp8", &quantize_fp8, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("fp8_q"), nb::arg("fp8_k"),
        nb::arg("vt"), nb::arg("q_descale"), nb::arg("k_descale"), nb::arg("v_descale"), nb::arg("rotate"),
        nb::arg("seed"), nb::arg("per_tensor"), nb::arg("stream"),
        "Writes the FP8 operands of forward_fp8 (e4m3 bytes as uint8 tensors, or int8 for INT8 Q and K; fp32 "
        "descales); see warpattn/fp8.hpp.");
  m.def("forward_fp8", &forward_fp8, nb::arg("q"), nb::arg("k"), nb::arg("vt"), nb::arg("q_descale"),
        nb::arg("k_descale"), nb::arg("v_descale"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("stream"), nb::arg("check_descales") = true,
        nb::kw_only(), nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f,
        nb::arg("sinks").none() = nb::none(), nb::arg("batch_invariant") = false,
        "FP8 attention on quantize_fp8's operands; out fp16 or bf16. window_left, window_right, sinks and "
        "batch_invariant as forward's; softcap is refused (the 16-bit forward only).");
  m.attr("fp8_head_dims") = nb::make_tuple(64, 128, 256);
  m.def("_array_facts", &array_facts, nb::arg("a"), "What the binding reads of an array (tests).");
  m.def("quantize_fp8_varlen", &quantize_fp8_varlen, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("fp8_q"),
        nb::arg("fp8_k"), nb::arg("vt"), nb::arg("q_descale"), nb::arg("k_descale"), nb::arg("v_descale"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("rotate"), nb::arg("seed"), nb::arg("per_tensor"),
        nb::arg("stream"), "quantize_fp8 on a packed batch (warpattn/fp8.hpp: sequence-aligned blocks).");
  m.def("forward_fp8_varlen", &forward_fp8_varlen, nb::arg("q"), nb::arg("k"), nb::arg("vt"), nb::arg("q_descale"),
        nb::arg("k_descale"), nb::arg("v_descale"), nb::arg("out"), nb::arg("lse").none(), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("seqused_k").none(), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("stream"), nb::arg("check_descales") = true,
        nb::kw_only(), nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f,
        nb::arg("sinks").none() = nb::none(), nb::arg("batch_invariant") = false,
        "forward_fp8 on a packed batch; out (total_q, heads, head_dim), lse (heads, total_q).");
}
