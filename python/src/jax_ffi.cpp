// warpattn as XLA FFI custom calls: JAX runs them inside jax.jit on XLA's own stream, with XLA's
// buffers (nothing copied, no host synchronisation). Each handler builds warpattn::TensorView s
// from the buffers (dense, row-major), calls the C++ API on the stream XLA passes, and returns
// a warpattn::Error as an InvalidArgument error with the same message.
//
// The same view-building code serves trace-time validation (jax_ffi_validate): there the
// buffers are shapes and dtypes with made-up addresses, and the library's validate_* functions
// check every argument rule without touching memory, so that a bad call is reported by
// jax.jit's tracing with the message the handler would give, before anything runs.
#include "jax_ffi.hpp"

#include <cuda_runtime.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "warpattn/warpattn.hpp"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace warpattn_python {
namespace {

using warpattn::DType;
using warpattn::TensorView;

constexpr const char* kForward = "warpattn_forward";
constexpr const char* kBackward = "warpattn_backward";
constexpr const char* kForwardVarlen = "warpattn_forward_varlen";
constexpr const char* kBackwardVarlen = "warpattn_backward_varlen";

// The backward's uint8 workspace result is this many bytes larger than the library asks for:
// XLA aligns its buffers to less than the 256 bytes the library wants, so the handler starts
// the workspace at the first 256-byte boundary inside the buffer.
constexpr size_t kWorkspaceAlign = 256;

constexpr const char* k16Bit = "float16 or bfloat16";

struct NamedType {
  ffi::DataType type;
  const char* name;  // NumPy's (and so JAX's) name of the dtype
};
constexpr NamedType kTypeNames[] = {
    {ffi::DataType::F16, "float16"},   {ffi::DataType::BF16, "bfloat16"},
    {ffi::DataType::F32, "float32"},   {ffi::DataType::F64, "float64"},
    {ffi::DataType::S8, "int8"},       {ffi::DataType::S16, "int16"},
    {ffi::DataType::S32, "int32"},     {ffi::DataType::S64, "int64"},
    {ffi::DataType::U8, "uint8"},      {ffi::DataType::U16, "uint16"},
    {ffi::DataType::U32, "uint32"},    {ffi::DataType::U64, "uint64"},
    {ffi::DataType::PRED, "bool"},     {ffi::DataType::F8E4M3FN, "float8_e4m3fn"},
    {ffi::DataType::F8E5M2, "float8_e5m2"}, {ffi::DataType::C64, "complex64"},
    {ffi::DataType::C128, "complex128"},
};

const char* name_of(ffi::DataType t) {
  for (const NamedType& n : kTypeNames)
    if (n.type == t) return n.name;
  return "an XLA dtype warpattn does not know";
}

ffi::DataType type_named(const std::string& name) {
  for (const NamedType& n : kTypeNames)
    if (name == n.name) return n.type;
  return ffi::DataType::INVALID;
}

std::optional<DType> warpattn_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16:
      return DType::f16;
    case ffi::DataType::BF16:
      return DType::bf16;
    case ffi::DataType::F32:
      return DType::f32;
    case ffi::DataType::S32:
      return DType::s32;
    case ffi::DataType::S8:
      return DType::s8;
    case ffi::DataType::F8E4M3FN:
      return DType::e4m3;
    default:
      return std::nullopt;
  }
}

[[noreturn]] void fail(const std::string& message) { throw warpattn::Error(message); }

// One buffer of a call: as XLA hands it to a handler, or at trace time a shape and a dtype at a
// made-up address.
struct Buf {
  void* data = nullptr;
  ffi::DataType type = ffi::DataType::INVALID;
  const int64_t* dims = nullptr;
  size_t rank = 0;
};

Buf buf_of(const ffi::AnyBuffer& b) {
  const auto dims = b.dimensions();
  return {b.untyped_data(), b.element_type(), dims.begin(), dims.size()};
}

// Leading axes beyond the rank warpattn takes: a handler folds them into the first axis, since
// under vmap ffi_call's "broadcast_all" batching puts the mapped axes in front of every operand
// and result, and for the dense calls they are more batch (row-major buffers: the fold is free).
// Trace-time validation sees the per-example shapes and refuses them.
enum class Extra { fold, refuse };

TensorView view_of(const Buf& b, const char* name, int rank, const char* expected_dtype, Extra extra) {
  const std::optional<DType> dtype = warpattn_dtype(b.type);
  if (!dtype) fail(std::string(name) + ": expected dtype " + expected_dtype + ", got " + name_of(b.type));
  int64_t shape[4] = {0, 0, 0, 0};
  int view_rank = static_cast<int>(b.rank);
  if (extra == Extra::fold && b.rank > static_cast<size_t>(rank)) {
    const size_t lead = b.rank - static_cast<size_t>(rank) + 1;
    shape[0] = 1;
    for (size_t i = 0; i < lead; ++i) shape[0] *= b.dims[i];
    for (int i = 1; i < rank; ++i) shape[i] = b.dims[lead + static_cast<size_t>(i) - 1];
    view_rank = rank;
  } else if (b.rank > 4) {
    fail(std::string(name) + ": expected rank " + std::to_string(rank) + ", got rank " + std::to_string(b.rank));
  } else {
    for (size_t i = 0; i < b.rank; ++i) shape[i] = b.dims[i];
  }
  // Rank below the expected one: kept, for the library to report by name.
  return warpattn::make_contiguous_view(b.data, *dtype, view_rank, shape);
}

// The attributes of the four calls (each binds the ones it has, by these names).
struct Attrs {
  float softmax_scale = 0.0f;
  bool has_scale = false;  // false: the library's default scale, 1/sqrt(head_dim)
  bool causal = false;
  bool deterministic = false;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
};

warpattn::ForwardOptions forward_options(const Attrs& a) {
  warpattn::ForwardOptions o;
  if (a.has_scale) o.softmax_scale = a.softmax_scale;
  o.causal = a.causal;
  return o;
}

warpattn::BackwardOptions backward_options(const Attrs& a) {
  warpattn::BackwardOptions o;
  if (a.has_scale) o.softmax_scale = a.softmax_scale;
  o.causal = a.causal;
  o.deterministic = a.deterministic;
  return o;
}

// ---- the calls, as views: one builder per call, used by its handler and by validation
struct Forward {
  TensorView q, k, v, out;
  std::optional<TensorView> lse;
  warpattn::ForwardOptions options;
};

// Dense: q, out (B, Sq, Hq, D); k, v (B, Sk, Hkv, D); lse (B, Hq, Sq).
// Packed (varlen): q, out (total_q, Hq, D); k, v (total_k, Hkv, D); lse (Hq, total_q).
Forward forward_call(const Buf& q, const Buf& k, const Buf& v, const Buf& out, const Buf* lse, const Attrs& a,
                     bool varlen, Extra extra) {
  const int rank = varlen ? 3 : 4;
  Forward f{view_of(q, "q", rank, k16Bit, extra), view_of(k, "k", rank, k16Bit, extra),
            view_of(v, "v", rank, k16Bit, extra), view_of(out, "out", rank, k16Bit, extra), std::nullopt,
            forward_options(a)};
  if (lse) f.lse = view_of(*lse, "lse", rank - 1, "float32", extra);
  return f;
}

struct Backward {
  TensorView dout, q, k, v, out, lse, dq, dk, dv;
  warpattn::BackwardOptions options;
  warpattn::Workspace workspace;
};

// The library's workspace inside the uint8 buffer: from its first 256-byte boundary on.
warpattn::Workspace workspace_of(const Buf& w) {
  size_t bytes = ffi::ByteWidth(w.type);
  for (size_t i = 0; i < w.rank; ++i) bytes *= static_cast<size_t>(w.dims[i]);
  const uintptr_t address = reinterpret_cast<uintptr_t>(w.data);
  const uintptr_t aligned = (address + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  const size_t skipped = aligned - address;
  return {reinterpret_cast<void*>(aligned), bytes > skipped ? bytes - skipped : 0};
}

// operands: dout, q, k, v, out, lse (then the offsets, for varlen); results: dq, dk, dv, workspace.
Backward backward_call(const Buf* operands, const Buf* results, const Attrs& a, bool varlen, Extra extra) {
  const int rank = varlen ? 3 : 4;
  const char* names[6] = {"dout", "q", "k", "v", "out", "lse"};
  TensorView views[6];
  for (int i = 0; i < 6; ++i)
    views[i] = view_of(operands[i], names[i], i == 5 ? rank - 1 : rank, i == 5 ? "float32" : k16Bit, extra);
  return Backward{views[0],
                  views[1],
                  views[2],
                  views[3],
                  views[4],
                  views[5],
                  view_of(results[0], "dq", rank, k16Bit, extra),
                  view_of(results[1], "dk", rank, k16Bit, extra),
                  view_of(results[2], "dv", rank, k16Bit, extra),
                  backward_options(a),
                  workspace_of(results[3])};
}

warpattn::VarlenBatch varlen_batch(const Buf& cu_seqlens_q, const Buf& cu_seqlens_k, const Buf* seqused_k,
                                   const Attrs& a) {
  warpattn::VarlenBatch batch;
  batch.cu_seqlens_q = view_of(cu_seqlens_q, "cu_seqlens_q", 1, "int32", Extra::refuse);
  batch.cu_seqlens_k = view_of(cu_seqlens_k, "cu_seqlens_k", 1, "int32", Extra::refuse);
  if (seqused_k) batch.seqused_k = view_of(*seqused_k, "seqused_k", 1, "int32", Extra::refuse);
  batch.max_seqlen_q = a.max_seqlen_q;
  batch.max_seqlen_k = a.max_seqlen_k;
  return batch;
}

// ---- handlers
template <class Body>
ffi::Error guarded(Body body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const warpattn::Error& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("warpattn: ") + e.what());
  }
}

// Zeroes `regions` on `stream`, with the device of their memory current meanwhile (the runtime
// enqueues on the current device; XLA's thread may have another one current).
void zero_async(std::initializer_list<std::pair<void*, size_t>> regions, cudaStream_t stream) {
  const auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail(std::string("warpattn: ") + what + " failed: " + cudaGetErrorString(e));
  };
  void* first = nullptr;
  for (const auto& [p, n] : regions)
    if (p != nullptr && n != 0 && first == nullptr) first = p;
  if (first == nullptr) return;
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, first), "cudaPointerGetAttributes");
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    fail("dq, dk, dv: expected device memory (XLA GPU buffers), got memory of CUDA memory type " +
         std::to_string(static_cast<int>(attributes.type)));
  int previous = 0;
  check(cudaGetDevice(&previous), "cudaGetDevice");
  if (attributes.device >= 0 && attributes.device != previous) check(cudaSetDevice(attributes.device), "cudaSetDevice");
  cudaError_t e = cudaSuccess;
  for (const auto& [p, n] : regions)
    if (e == cudaSuccess && p != nullptr && n != 0) e = cudaMemsetAsync(p, 0, n, stream);
  if (attributes.device >= 0 && attributes.device != previous) cudaSetDevice(previous);
  check(e, "cudaMemsetAsync");
}

size_t bytes_of(const TensorView& t) {
  return static_cast<size_t>(t.numel()) * static_cast<size_t>(warpattn::dtype_size(t.dtype));
}

Attrs scale_attrs(bool causal, bool has_scale, float softmax_scale) {
  Attrs a;
  a.causal = causal;
  a.has_scale = has_scale;
  a.softmax_scale = softmax_scale;
  return a;
}

using Out = ffi::Result<ffi::AnyBuffer>;
using OptionalOut = std::optional<ffi::Result<ffi::AnyBuffer>>;

ffi::Error forward_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, Out out,
                        OptionalOut lse, bool causal, bool has_scale, float softmax_scale) {
  return guarded([&] {
    const Buf lse_buf = lse ? buf_of(**lse) : Buf{};
    const Forward f = forward_call(buf_of(q), buf_of(k), buf_of(v), buf_of(*out), lse ? &lse_buf : nullptr,
                                   scale_attrs(causal, has_scale, softmax_scale), false, Extra::fold);
    warpattn::forward(f.q, f.k, f.v, f.out, f.lse, f.options, stream);
  });
}

ffi::Error backward_impl(cudaStream_t stream, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, Out dq, Out dk, Out dv,
                         Out workspace, bool causal, bool has_scale, float softmax_scale, bool deterministic) {
  return guarded([&] {
    const Buf operands[6] = {buf_of(dout), buf_of(q), buf_of(k), buf_of(v), buf_of(out), buf_of(lse)};
    const Buf results[4] = {buf_of(*dq), buf_of(*dk), buf_of(*dv), buf_of(*workspace)};
    Attrs a = scale_attrs(causal, has_scale, softmax_scale);
    a.deterministic = deterministic;
    const Backward b = backward_call(operands, results, a, false, Extra::fold);
    warpattn::backward(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, b.options, b.workspace, stream);
  });
}

ffi::Error forward_varlen_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                               ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k,
                               std::optional<ffi::AnyBuffer> seqused_k, Out out, OptionalOut lse, bool causal,
                               bool has_scale, float softmax_scale, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  return guarded([&] {
    Attrs a = scale_attrs(causal, has_scale, softmax_scale);
    a.max_seqlen_q = max_seqlen_q;
    a.max_seqlen_k = max_seqlen_k;
    const Buf lse_buf = lse ? buf_of(**lse) : Buf{};
    const Buf used = seqused_k ? buf_of(*seqused_k) : Buf{};
    const Forward f = forward_call(buf_of(q), buf_of(k), buf_of(v), buf_of(*out), lse ? &lse_buf : nullptr, a, true,
                                   Extra::fold);
    const warpattn::VarlenBatch batch =
        varlen_batch(buf_of(cu_seqlens_q), buf_of(cu_seqlens_k), seqused_k ? &used : nullptr, a);
    warpattn::forward_varlen(f.q, f.k, f.v, f.out, f.lse, batch, f.options, stream);
  });
}

ffi::Error backward_varlen_impl(cudaStream_t stream, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer cu_seqlens_q,
                                ffi::AnyBuffer cu_seqlens_k, std::optional<ffi::AnyBuffer> seqused_k, Out dq, Out dk,
                                Out dv, Out workspace, bool causal, bool has_scale, float softmax_scale,
                                bool deterministic, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  return guarded([&] {
    const Buf operands[6] = {buf_of(dout), buf_of(q), buf_of(k), buf_of(v), buf_of(out), buf_of(lse)};
    const Buf results[4] = {buf_of(*dq), buf_of(*dk), buf_of(*dv), buf_of(*workspace)};
    Attrs a = scale_attrs(causal, has_scale, softmax_scale);
    a.deterministic = deterministic;
    a.max_seqlen_q = max_seqlen_q;
    a.max_seqlen_k = max_seqlen_k;
    const Buf used = seqused_k ? buf_of(*seqused_k) : Buf{};
    const Backward b = backward_call(operands, results, a, true, Extra::fold);
    const warpattn::VarlenBatch batch =
        varlen_batch(buf_of(cu_seqlens_q), buf_of(cu_seqlens_k), seqused_k ? &used : nullptr, a);
    warpattn::validate_backward_varlen(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, batch, b.options,
                                       b.workspace);
    // XLA's results start uninitialised; the kernels write only the rows and keys the sequences
    // use, and the others must read as zero gradients (as flash_attn_varlen_backward's are).
    zero_async({{b.dq.data, bytes_of(b.dq)}, {b.dk.data, bytes_of(b.dk)}, {b.dv.data, bytes_of(b.dv)}}, stream);
    warpattn::backward_varlen(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, batch, b.options, b.workspace,
                              stream);
  });
}

// The bindings, by the names the Python side gives the operands, results and attributes. Each
// is used twice: after the CUDA stream for XLA's GPU (the real handlers), and without it for the
// host check below.
template <class B>
auto bind_forward(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // q
      .template Arg<ffi::AnyBuffer>()          // k
      .template Arg<ffi::AnyBuffer>()          // v
      .template Ret<ffi::AnyBuffer>()          // out
      .template OptionalRet<ffi::AnyBuffer>()  // lse
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale");
}

template <class B>
auto bind_backward(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()  // dout
      .template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()  // k
      .template Arg<ffi::AnyBuffer>()  // v
      .template Arg<ffi::AnyBuffer>()  // out
      .template Arg<ffi::AnyBuffer>()  // lse
      .template Ret<ffi::AnyBuffer>()  // dq
      .template Ret<ffi::AnyBuffer>()  // dk
      .template Ret<ffi::AnyBuffer>()  // dv
      .template Ret<ffi::AnyBuffer>()  // workspace (uint8)
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("deterministic");
}

template <class B>
auto bind_forward_varlen(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // q
      .template Arg<ffi::AnyBuffer>()          // k
      .template Arg<ffi::AnyBuffer>()          // v
      .template Arg<ffi::AnyBuffer>()          // cu_seqlens_q
      .template Arg<ffi::AnyBuffer>()          // cu_seqlens_k
      .template OptionalArg<ffi::AnyBuffer>()  // seqused_k
      .template Ret<ffi::AnyBuffer>()          // out
      .template OptionalRet<ffi::AnyBuffer>()  // lse
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<int64_t>("max_seqlen_q")
      .template Attr<int64_t>("max_seqlen_k");
}

template <class B>
auto bind_backward_varlen(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // dout
      .template Arg<ffi::AnyBuffer>()          // q
      .template Arg<ffi::AnyBuffer>()          // k
      .template Arg<ffi::AnyBuffer>()          // v
      .template Arg<ffi::AnyBuffer>()          // out
      .template Arg<ffi::AnyBuffer>()          // lse
      .template Arg<ffi::AnyBuffer>()          // cu_seqlens_q
      .template Arg<ffi::AnyBuffer>()          // cu_seqlens_k
      .template OptionalArg<ffi::AnyBuffer>()  // seqused_k
      .template Ret<ffi::AnyBuffer>()          // dq
      .template Ret<ffi::AnyBuffer>()          // dk
      .template Ret<ffi::AnyBuffer>()          // dv
      .template Ret<ffi::AnyBuffer>()          // workspace (uint8)
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("deterministic")
      .template Attr<int64_t>("max_seqlen_q")
      .template Attr<int64_t>("max_seqlen_k");
}

auto on_gpu() { return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>(); }

XLA_FFI_DEFINE_HANDLER(kForwardHandler, forward_impl, bind_forward(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kBackwardHandler, backward_impl, bind_backward(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kForwardVarlenHandler, forward_varlen_impl, bind_forward_varlen(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kBackwardVarlenHandler, backward_varlen_impl, bind_backward_varlen(on_gpu()));

// The host check: the same handlers without a stream, to be registered for XLA's CPU platform by
// tests on machines without a GPU. They decode the call frame, build the views (folding vmap's
// axes, placing the workspace) and run every argument rule of the library call, which then stops
// at its device check (XLA's CPU buffers are not device memory): so the message says whether
// the call got that far. Nothing is launched or written.
constexpr auto forward_on_host = [](auto... a) { return forward_impl(nullptr, a...); };
constexpr auto backward_on_host = [](auto... a) { return backward_impl(nullptr, a...); };
constexpr auto forward_varlen_on_host = [](auto... a) { return forward_varlen_impl(nullptr, a...); };
constexpr auto backward_varlen_on_host = [](auto... a) { return backward_varlen_impl(nullptr, a...); };
XLA_FFI_DEFINE_HANDLER(kForwardHostCheck, forward_on_host, bind_forward(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kBackwardHostCheck, backward_on_host, bind_backward(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kForwardVarlenHostCheck, forward_varlen_on_host, bind_forward_varlen(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kBackwardVarlenHostCheck, backward_varlen_on_host, bind_backward_varlen(ffi::Ffi::Bind()));

// ---- trace-time validation from Python

// Buffers described from Python as (shape, dtype name), each at its own made-up address: 256-byte
// aligned and 2^52 bytes apart, so the library's alignment and overlap rules pass as they do for
// XLA's (distinct, aligned) buffers. The shapes live as long as this object.
class Specs {
 public:
  Specs(nb::handle seq, const char* what, size_t first_index) {
    const size_t n = nb::len(seq);
    shapes_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      nb::handle item = seq[i];
      if (!nb::isinstance<nb::tuple>(item) || nb::len(item) != 2)
        throw nb::type_error((std::string(what) + ": expected (shape, dtype name) pairs").c_str());
      std::vector<int64_t>& shape = shapes_.emplace_back();
      for (nb::handle d : nb::borrow<nb::object>(item[0])) shape.push_back(nb::cast<int64_t>(d));
      Buf b;
      b.data = reinterpret_cast<void*>(static_cast<uintptr_t>(first_index + i + 1) << 52);
      b.type = type_named(nb::cast<std::string>(item[1]));
      b.dims = shape.data();
      b.rank = shape.size();
      bufs_.push_back(b);
    }
  }
  size_t size() const { return bufs_.size(); }
  const Buf* data() const { return bufs_.data(); }
  const Buf& operator[](size_t i) const { return bufs_[i]; }

 private:
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<Buf> bufs_;
};

template <class T>
T attr(const nb::dict& attrs, const char* name, T fallback) {
  return attrs.contains(name) ? nb::cast<T>(attrs[name]) : fallback;
}

Attrs attrs_of(const nb::dict& d) {
  Attrs a;
  a.softmax_scale = attr<float>(d, "softmax_scale", 0.0f);
  a.has_scale = attr<bool>(d, "has_scale", false);
  a.causal = attr<bool>(d, "causal", false);
  a.deterministic = attr<bool>(d, "deterministic", false);
  a.max_seqlen_q = attr<int64_t>(d, "max_seqlen_q", 0);
  a.max_seqlen_k = attr<int64_t>(d, "max_seqlen_k", 0);
  return a;
}

void expect_count(const std::string& target, const char* what, size_t got, size_t low, size_t high) {
  if (got >= low && got <= high) return;
  throw nb::value_error((target + ": expected " + std::to_string(low) + (high > low ? "-" + std::to_string(high) : "") +
                         " " + what + ", got " + std::to_string(got))
                            .c_str());
}

void validate(const std::string& target, nb::handle operand_specs, nb::handle result_specs, const nb::dict& attrs) {
  const Specs ops(operand_specs, "operands", 0);
  const Specs res(result_specs, "results", ops.size());
  const Attrs a = attrs_of(attrs);
  try {
    if (target == kForward || target == kForwardVarlen) {
      const bool varlen = target == kForwardVarlen;
      expect_count(target, "operands", ops.size(), varlen ? 5 : 3, varlen ? 6 : 3);
      expect_count(target, "results", res.size(), 1, 2);
      const Forward f = forward_call(ops[0], ops[1], ops[2], res[0], res.size() > 1 ? &res[1] : nullptr, a, varlen,
                                     Extra::refuse);
      if (!varlen) {
        warpattn::validate_forward(f.q, f.k, f.v, f.out, f.lse, f.options);
      } else {
        const warpattn::VarlenBatch batch = varlen_batch(ops[3], ops[4], ops.size() > 5 ? &ops[5] : nullptr, a);
        warpattn::validate_forward_varlen(f.q, f.k, f.v, f.out, f.lse, batch, f.options);
      }
    } else if (target == kBackward || target == kBackwardVarlen) {
      const bool varlen = target == kBackwardVarlen;
      expect_count(target, "operands", ops.size(), varlen ? 8 : 6, varlen ? 9 : 6);
      expect_count(target, "results", res.size(), 4, 4);
      const Backward b = backward_call(ops.data(), res.data(), a, varlen, Extra::refuse);
      if (!varlen) {
        warpattn::validate_backward(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, b.options, b.workspace);
      } else {
        const warpattn::VarlenBatch batch = varlen_batch(ops[6], ops[7], ops.size() > 8 ? &ops[8] : nullptr, a);
        warpattn::validate_backward_varlen(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, batch, b.options,
                                           b.workspace);
      }
    } else {
      throw nb::value_error(("jax_ffi_validate: no warpattn FFI target named " + target).c_str());
    }
  } catch (const warpattn::Error& e) {
    throw nb::value_error(e.what());
  }
}

size_t workspace_bytes(const std::string& target, nb::handle q_spec, int64_t batch, const nb::dict& attrs) {
  const Specs q(nb::make_tuple(q_spec), "q", 0);
  const warpattn::BackwardOptions options = backward_options(attrs_of(attrs));
  try {
    if (target == kBackward)
      return warpattn::backward_workspace_bytes(view_of(q[0], "q", 4, k16Bit, Extra::refuse), options) +
             kWorkspaceAlign;
    if (target == kBackwardVarlen)
      return warpattn::backward_varlen_workspace_bytes(view_of(q[0], "q", 3, k16Bit, Extra::refuse), batch, options) +
             kWorkspaceAlign;
  } catch (const warpattn::Error& e) {
    throw nb::value_error(e.what());
  }
  throw nb::value_error(("jax_ffi_workspace_bytes: " + target + " is not a backward target").c_str());
}

nb::capsule capsule_of(XLA_FFI_Handler* handler) { return nb::capsule(reinterpret_cast<void*>(handler)); }

nb::dict targets_of(XLA_FFI_Handler* forward, XLA_FFI_Handler* backward, XLA_FFI_Handler* forward_varlen,
                    XLA_FFI_Handler* backward_varlen) {
  nb::dict targets;
  targets[kForward] = capsule_of(forward);
  targets[kBackward] = capsule_of(backward);
  targets[kForwardVarlen] = capsule_of(forward_varlen);
  targets[kBackwardVarlen] = capsule_of(backward_varlen);
  return targets;
}

}  // namespace

void add_jax_ffi(nb::module_& m) {
  m.def(
      "jax_ffi_targets",
      [] { return targets_of(kForwardHandler, kBackwardHandler, kForwardVarlenHandler, kBackwardVarlenHandler); },
      "{XLA FFI target name: PyCapsule of its handler}, for jax.ffi.register_ffi_target(..., platform='CUDA').");
  m.def(
      "jax_ffi_host_check_targets",
      [] {
        return targets_of(kForwardHostCheck, kBackwardHostCheck, kForwardVarlenHostCheck, kBackwardVarlenHostCheck);
      },
      "For tests without a GPU: the same names and handlers without a stream, for platform='cpu'. Each decodes "
      "its call, builds the views and checks every argument rule, then fails at the library's device check "
      "(XLA's CPU buffers are not device memory); nothing runs.");
  m.def("jax_ffi_validate", &validate, nb::arg("target"), nb::arg("operands"), nb::arg("results"),
        nb::arg("attrs"),
        "Checks the FFI call `target` on (shape, dtype name) descriptions of its operands and results and its "
        "attributes: ValueError with warpattn's message for the first rule broken.");
  m.def("jax_ffi_workspace_bytes", &workspace_bytes, nb::arg("target"), nb::arg("q"), nb::arg("batch"),
        nb::arg("attrs"),
        "Bytes of the uint8 workspace result of the backward target for q = (shape, dtype name) and `batch` "
        "sequences (varlen).");
}

}  // namespace warpattn_python
