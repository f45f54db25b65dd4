// warpattn as XLA FFI custom calls: JAX runs them inside jax.jit on XLA's own stream, with XLA's
// buffers (nothing copied, no host synchronisation). Seven calls: the forward and backward, dense
// and packed, FP8's pair (quantize_fp8, forward_fp8), and the forward over KV caches. Each handler builds
// warpattn::TensorView s from the buffers (dense, row-major), calls the C++ API on the stream XLA
// passes, and returns a warpattn::Error as an InvalidArgument error with the same message.
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

#include "warpattn/fp8.hpp"
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
constexpr const char* kQuantizeFp8 = "warpattn_quantize_fp8";
constexpr const char* kForwardFp8 = "warpattn_forward_fp8";
constexpr const char* kForwardKvcache = "warpattn_forward_kvcache";

// The backward's uint8 workspace result is this many bytes larger than the library asks for:
// XLA aligns its buffers to less than the 256 bytes the library wants, so the handler starts
// the workspace at the first 256-byte boundary inside the buffer.
constexpr size_t kWorkspaceAlign = 256;

constexpr const char* k16Bit = "float16 or bfloat16";
constexpr const char* kFp8Codes = "float8_e4m3fn or int8";  // FP8 Q and K: e4m3, or INT8 codes
constexpr const char* kE4m3 = "float8_e4m3fn";

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

// The attributes of the calls (each binds the ones it has, by these names).
struct Attrs {
  float softmax_scale = 0.0f;
  bool has_scale = false;  // false: the library's default scale, 1/sqrt(head_dim)
  bool causal = false;
  bool deterministic = false;
  bool batch_invariant = false;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  // The model options of the forward calls and of the backward ones (the sinks are an operand,
  // dsinks a result). has_sinks says which of a varlen call's two optional operands came: XLA
  // decodes them by position, so sinks without seqused_k would otherwise land in seqused_k's
  // place.
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool has_sinks = false;
  // the KV-cache call's: which of its optional operands and results came (in the order of
  // kvcache_call), and its split count
  bool has_new_kv = false, has_cache_seqlens = false, has_block_table = false, has_lse = false;
  int32_t num_splits = 0;
  // quantize_fp8's
  bool rotate = true;
  uint64_t seed = 0;
  bool per_tensor = false;
};

// The sinks, when given, are set by the call's builder from their buffer.
warpattn::ForwardOptions forward_options(const Attrs& a) {
  warpattn::ForwardOptions o;
  if (a.has_scale) o.softmax_scale = a.softmax_scale;
  o.causal = a.causal;
  o.batch_invariant = a.batch_invariant;
  o.window_left = a.window_left;
  o.window_right = a.window_right;
  o.softcap = a.softcap;
  return o;
}

// The sinks operand: (heads_q,) float32, never folded (the calls that take it run one per
// example under vmap: warpattn.jax_ffi asks for "sequential" batching when sinks are given, since
// sinks mapped with the examples could not be folded into the batch).
std::optional<TensorView> sinks_view(const Buf* sinks) {
  if (!sinks) return std::nullopt;
  return view_of(*sinks, "sinks", 1, "float32", Extra::refuse);
}

// The sinks and dsinks, when given, are set by the call's builder from their buffers.
warpattn::BackwardOptions backward_options(const Attrs& a) {
  warpattn::BackwardOptions o;
  if (a.has_scale) o.softmax_scale = a.softmax_scale;
  o.causal = a.causal;
  o.deterministic = a.deterministic;
  o.batch_invariant = a.batch_invariant;
  o.window_left = a.window_left;
  o.window_right = a.window_right;
  o.softcap = a.softcap;
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
Forward forward_call(const Buf& q, const Buf& k, const Buf& v, const Buf& out, const Buf* lse, const Buf* sinks,
                     const Attrs& a, bool varlen, Extra extra) {
  const int rank = varlen ? 3 : 4;
  Forward f{view_of(q, "q", rank, k16Bit, extra), view_of(k, "k", rank, k16Bit, extra),
            view_of(v, "v", rank, k16Bit, extra), view_of(out, "out", rank, k16Bit, extra), std::nullopt,
            forward_options(a)};
  if (lse) f.lse = view_of(*lse, "lse", rank - 1, "float32", extra);
  f.options.sinks = sinks_view(sinks);
  return f;
}

// FP8 operands (fp8.hpp): q, k (B, S, H, D) e4m3 or int8, vt (B, Hkv, D, Sk rounded up to 16)
// e4m3, the descales (B, H, blocks) float32. `prefix` names them as the library does where
// they are what quantize_fp8 writes ("fp8.").
warpattn::Fp8Operands fp8_operands(const Buf* six, const std::string& prefix, Extra extra) {
  const std::string names[6] = {prefix + "q",         prefix + "k",         prefix + "vt",
                                prefix + "q_descale", prefix + "k_descale", prefix + "v_descale"};
  const char* types[6] = {kFp8Codes, kFp8Codes, kE4m3, "float32", "float32", "float32"};
  TensorView v[6];
  for (int i = 0; i < 6; ++i) v[i] = view_of(six[i], names[i].c_str(), i < 3 ? 4 : 3, types[i], extra);
  return {v[0], v[1], v[2], v[3], v[4], v[5]};
}

warpattn::QuantizeOptions quantize_options(const Attrs& a) {
  warpattn::QuantizeOptions o;
  o.rotate = a.rotate;
  o.seed = a.seed;
  o.scaling = a.per_tensor ? warpattn::Fp8Scaling::per_tensor : warpattn::Fp8Scaling::per_block;
  return o;
}

struct Quantize {
  TensorView q, k, v;
  warpattn::Fp8Operands fp8;
  warpattn::QuantizeOptions options;
};

// operands: q, k, v; results: the six FP8 operands.
Quantize quantize_call(const Buf* operands, const Buf* results, const Attrs& a, Extra extra) {
  return {view_of(operands[0], "q", 4, k16Bit, extra), view_of(operands[1], "k", 4, k16Bit, extra),
          view_of(operands[2], "v", 4, k16Bit, extra), fp8_operands(results, "fp8.", extra), quantize_options(a)};
}

struct ForwardFp8 {
  warpattn::Fp8Operands fp8;
  TensorView out;
  std::optional<TensorView> lse;
  warpattn::ForwardOptions options;
};

// operands: the six FP8 operands (then the sinks, if given); results: out (B, Sq, Hq, D) float16
// or bfloat16, lse.
ForwardFp8 forward_fp8_call(const Buf* operands, const Buf& out, const Buf* lse, const Buf* sinks, const Attrs& a,
                            Extra extra) {
  ForwardFp8 f{fp8_operands(operands, "", extra), view_of(out, "out", 4, k16Bit, extra), std::nullopt,
               forward_options(a)};
  if (lse) f.lse = view_of(*lse, "lse", 3, "float32", extra);
  f.options.sinks = sinks_view(sinks);
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
// sinks, dsinks: the forward's sinks (an operand) and their gradient (a (heads_q,) float32
// result), or nullptr; never folded (with sinks the calls run one per example under vmap, as the
// forward's).
Backward backward_call(const Buf* operands, const Buf* results, const Buf* sinks, const Buf* dsinks, const Attrs& a,
                       bool varlen, Extra extra) {
  const int rank = varlen ? 3 : 4;
  const char* names[6] = {"dout", "q", "k", "v", "out", "lse"};
  TensorView views[6];
  for (int i = 0; i < 6; ++i)
    views[i] = view_of(operands[i], names[i], i == 5 ? rank - 1 : rank, i == 5 ? "float32" : k16Bit, extra);
  Backward b{views[0],
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
  b.options.sinks = sinks_view(sinks);
  if (dsinks) b.options.dsinks = view_of(*dsinks, "dsinks", 1, "float32", Extra::refuse);
  return b;
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

// The KV-cache call (warpattn::forward_kvcache). Operands: q, k_cache, v_cache, then those the
// flags name, in this order: k and v (has_new_kv), cache_seqlens, block_table, sinks. Results:
// out, then lse (has_lse), then with k and v the grown caches, which XLA aliases to the k_cache
// and v_cache operands (input_output_aliases: with those donated, the append is in place; else
// XLA copies them into the results first): the call appends into and attends over the results.
struct ForwardKvcache {
  TensorView q, out;
  std::optional<TensorView> lse;
  warpattn::KvCache cache;
  warpattn::ForwardOptions options;
};

ForwardKvcache kvcache_call(const std::vector<Buf>& operands, const std::vector<Buf>& results, const Attrs& a,
                            Extra extra) {
  size_t next = 3, next_result = 1;
  const auto operand = [&](bool given) { return given && next < operands.size() ? &operands[next++] : nullptr; };
  const auto result = [&](bool given) {
    return given && next_result < results.size() ? &results[next_result++] : nullptr;
  };
  const Buf* k = operand(a.has_new_kv);
  const Buf* v = operand(a.has_new_kv);
  const Buf* cache_seqlens = operand(a.has_cache_seqlens);
  const Buf* block_table = operand(a.has_block_table);
  const Buf* sinks = operand(a.has_sinks);
  if (next != operands.size())
    fail("kvcache: " + std::to_string(operands.size()) + " operands, but the call's flags name " + std::to_string(next));
  const Buf* lse = result(a.has_lse);
  const Buf* k_grown = result(a.has_new_kv);
  const Buf* v_grown = result(a.has_new_kv);
  if (next_result != results.size())
    fail("kvcache: " + std::to_string(results.size()) + " results, but the call's flags name " +
         std::to_string(next_result));
  if (a.has_new_kv && (!k || !v || !k_grown || !v_grown)) fail("k, v: has_new_kv without both and the grown caches");
  // The caches are read where they are written when appending (the aliased results).
  const Buf& k_cache = a.has_new_kv ? *k_grown : operands[1];
  const Buf& v_cache = a.has_new_kv ? *v_grown : operands[2];
  ForwardKvcache f{view_of(operands[0], "q", 4, k16Bit, extra), view_of(results[0], "out", 4, k16Bit, extra),
                   std::nullopt, {}, forward_options(a)};
  if (lse) f.lse = view_of(*lse, "lse", 3, "float32", extra);
  f.cache.k_cache = view_of(k_cache, "k_cache", 4, k16Bit, extra);
  f.cache.v_cache = view_of(v_cache, "v_cache", 4, k16Bit, extra);
  if (k) f.cache.k = view_of(*k, "k", 4, k16Bit, extra);
  if (v) f.cache.v = view_of(*v, "v", 4, k16Bit, extra);
  if (cache_seqlens) f.cache.cache_seqlens = view_of(*cache_seqlens, "cache_seqlens", 1, "int32", extra);
  if (block_table) f.cache.block_table = view_of(*block_table, "block_table", 2, "int32", extra);
  f.cache.num_splits = a.num_splits;
  f.options.sinks = sinks_view(sinks);
  return f;
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

Attrs scale_attrs(bool causal, bool has_scale, float softmax_scale, bool batch_invariant) {
  Attrs a;
  a.causal = causal;
  a.has_scale = has_scale;
  a.softmax_scale = softmax_scale;
  a.batch_invariant = batch_invariant;
  return a;
}

Attrs with_model_options(Attrs a, int32_t window_left, int32_t window_right, float softcap) {
  a.window_left = window_left;
  a.window_right = window_right;
  a.softcap = softcap;
  return a;
}

using OptionalIn = std::optional<ffi::AnyBuffer>;

// A handler's optional operand as a Buf (nullptr: not given), stored in `storage`.
const Buf* optional_buf(const OptionalIn& b, Buf& storage) {
  if (!b) return nullptr;
  storage = buf_of(*b);
  return &storage;
}

using Out = ffi::Result<ffi::AnyBuffer>;
using OptionalOut = std::optional<ffi::Result<ffi::AnyBuffer>>;

// The varlen calls' optional operands in the order they come, seqused_k (if given) then sinks (if
// has_sinks): the one XLA decoded into seqused_k's place is the sinks when it came alone.
struct VarlenOptionals {
  const Buf* seqused_k;
  const Buf* sinks;
};
VarlenOptionals varlen_optionals(const Buf* first, const Buf* second, bool has_sinks) {
  if (has_sinks && !first) fail("sinks: has_sinks is set but the call has no sinks operand");
  if (!has_sinks && second) fail("sinks: a second optional operand (the sinks) without has_sinks");
  if (!has_sinks) return {first, nullptr};
  return second ? VarlenOptionals{first, second} : VarlenOptionals{nullptr, first};
}

ffi::Error forward_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, OptionalIn sinks,
                        Out out, OptionalOut lse, bool causal, bool has_scale, float softmax_scale,
                        bool batch_invariant, int32_t window_left, int32_t window_right, float softcap) {
  return guarded([&] {
    const Buf lse_buf = lse ? buf_of(**lse) : Buf{};
    Buf sinks_buf;
    const Attrs a =
        with_model_options(scale_attrs(causal, has_scale, softmax_scale, batch_invariant), window_left, window_right,
                           softcap);
    const Forward f = forward_call(buf_of(q), buf_of(k), buf_of(v), buf_of(*out), lse ? &lse_buf : nullptr,
                                   optional_buf(sinks, sinks_buf), a, false, Extra::fold);
    warpattn::forward(f.q, f.k, f.v, f.out, f.lse, f.options, stream);
  });
}

ffi::Error backward_impl(cudaStream_t stream, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, OptionalIn sinks, Out dq, Out dk,
                         Out dv, Out workspace, OptionalOut dsinks, bool causal, bool has_scale, float softmax_scale,
                         bool deterministic, bool batch_invariant, int32_t window_left, int32_t window_right,
                         float softcap) {
  return guarded([&] {
    const Buf operands[6] = {buf_of(dout), buf_of(q), buf_of(k), buf_of(v), buf_of(out), buf_of(lse)};
    const Buf results[4] = {buf_of(*dq), buf_of(*dk), buf_of(*dv), buf_of(*workspace)};
    Attrs a = with_model_options(scale_attrs(causal, has_scale, softmax_scale, batch_invariant), window_left,
                                 window_right, softcap);
    a.deterministic = deterministic;
    Buf sinks_buf;
    const Buf dsinks_buf = dsinks ? buf_of(**dsinks) : Buf{};
    const Backward b = backward_call(operands, results, optional_buf(sinks, sinks_buf), dsinks ? &dsinks_buf : nullptr,
                                     a, false, Extra::fold);
    warpattn::backward(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, b.options, b.workspace, stream);
  });
}

ffi::Error forward_varlen_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                               ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k, OptionalIn optional_1,
                               OptionalIn optional_2, Out out, OptionalOut lse, bool causal, bool has_scale,
                               float softmax_scale, bool batch_invariant, int64_t max_seqlen_q, int64_t max_seqlen_k,
                               int32_t window_left, int32_t window_right, float softcap, bool has_sinks) {
  return guarded([&] {
    Attrs a = with_model_options(scale_attrs(causal, has_scale, softmax_scale, batch_invariant), window_left,
                                 window_right, softcap);
    a.max_seqlen_q = max_seqlen_q;
    a.max_seqlen_k = max_seqlen_k;
    const Buf lse_buf = lse ? buf_of(**lse) : Buf{};
    Buf storage_1, storage_2;
    const VarlenOptionals given =
        varlen_optionals(optional_buf(optional_1, storage_1), optional_buf(optional_2, storage_2), has_sinks);
    const Forward f = forward_call(buf_of(q), buf_of(k), buf_of(v), buf_of(*out), lse ? &lse_buf : nullptr,
                                   given.sinks, a, true, Extra::fold);
    const warpattn::VarlenBatch batch = varlen_batch(buf_of(cu_seqlens_q), buf_of(cu_seqlens_k), given.seqused_k, a);
    warpattn::forward_varlen(f.q, f.k, f.v, f.out, f.lse, batch, f.options, stream);
  });
}

ffi::Error backward_varlen_impl(cudaStream_t stream, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer cu_seqlens_q,
                                ffi::AnyBuffer cu_seqlens_k, OptionalIn optional_1, OptionalIn optional_2, Out dq,
                                Out dk, Out dv, Out workspace, OptionalOut dsinks, bool causal, bool has_scale,
                                float softmax_scale, bool deterministic, bool batch_invariant, int64_t max_seqlen_q,
                                int64_t max_seqlen_k, int32_t window_left, int32_t window_right, float softcap,
                                bool has_sinks) {
  return guarded([&] {
    const Buf operands[6] = {buf_of(dout), buf_of(q), buf_of(k), buf_of(v), buf_of(out), buf_of(lse)};
    const Buf results[4] = {buf_of(*dq), buf_of(*dk), buf_of(*dv), buf_of(*workspace)};
    Attrs a = with_model_options(scale_attrs(causal, has_scale, softmax_scale, batch_invariant), window_left,
                                 window_right, softcap);
    a.deterministic = deterministic;
    a.max_seqlen_q = max_seqlen_q;
    a.max_seqlen_k = max_seqlen_k;
    Buf storage_1, storage_2;
    const VarlenOptionals given =
        varlen_optionals(optional_buf(optional_1, storage_1), optional_buf(optional_2, storage_2), has_sinks);
    const Buf dsinks_buf = dsinks ? buf_of(**dsinks) : Buf{};
    const Backward b =
        backward_call(operands, results, given.sinks, dsinks ? &dsinks_buf : nullptr, a, true, Extra::fold);
    const warpattn::VarlenBatch batch = varlen_batch(buf_of(cu_seqlens_q), buf_of(cu_seqlens_k), given.seqused_k, a);
    warpattn::validate_backward_varlen(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, batch, b.options,
                                       b.workspace);
    // XLA's results start uninitialised; the kernels write only the rows and keys the sequences
    // use, and the others must read as zero gradients (as flash_attn_varlen_backward's are).
    zero_async({{b.dq.data, bytes_of(b.dq)}, {b.dk.data, bytes_of(b.dk)}, {b.dv.data, bytes_of(b.dv)}}, stream);
    warpattn::backward_varlen(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, batch, b.options, b.workspace,
                              stream);
  });
}

ffi::Error quantize_fp8_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, Out fp8_q,
                             Out fp8_k, Out vt, Out q_descale, Out k_descale, Out v_descale, bool rotate,
                             int64_t seed_bits, bool per_tensor) {
  return guarded([&] {
    const Buf operands[3] = {buf_of(q), buf_of(k), buf_of(v)};
    const Buf results[6] = {buf_of(*fp8_q),     buf_of(*fp8_k),     buf_of(*vt),
                            buf_of(*q_descale), buf_of(*k_descale), buf_of(*v_descale)};
    Attrs a;
    a.rotate = rotate;
    a.seed = static_cast<uint64_t>(seed_bits);
    a.per_tensor = per_tensor;
    const Quantize c = quantize_call(operands, results, a, Extra::fold);
    warpattn::quantize_fp8(c.q, c.k, c.v, c.fp8, c.options, stream);
  });
}

ffi::Error forward_fp8_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer vt,
                            ffi::AnyBuffer q_descale, ffi::AnyBuffer k_descale, ffi::AnyBuffer v_descale,
                            OptionalIn sinks, Out out, OptionalOut lse, bool causal, bool has_scale,
                            float softmax_scale, bool batch_invariant, int32_t window_left, int32_t window_right,
                            float softcap) {
  return guarded([&] {
    const Buf operands[6] = {buf_of(q),         buf_of(k),         buf_of(vt),
                             buf_of(q_descale), buf_of(k_descale), buf_of(v_descale)};
    const Buf lse_buf = lse ? buf_of(**lse) : Buf{};
    Buf sinks_buf;
    const Attrs a = with_model_options(scale_attrs(causal, has_scale, softmax_scale, batch_invariant), window_left,
                                       window_right, softcap);
    const ForwardFp8 f = forward_fp8_call(operands, buf_of(*out), lse ? &lse_buf : nullptr,
                                          optional_buf(sinks, sinks_buf), a, Extra::fold);
    // Descales unchecked here: checking reads them back and waits for the stream, which a
    // custom call must not do (XLA's stream runs ahead of the host). warpattn.jax_ffi checks
    // concrete descales before the call instead.
    warpattn::forward_fp8(f.fp8, f.out, f.lse, f.options, stream, /*check_descales=*/false);
  });
}

// The KV-cache call: its operands and results as their flags say (kvcache_call); never folded
// under vmap (warpattn.jax_ffi runs one call per example: a block table's pages are per cache).
ffi::Error forward_kvcache_impl(cudaStream_t stream, ffi::RemainingArgs operands, ffi::RemainingRets results,
                                bool causal, bool has_scale, float softmax_scale, bool batch_invariant,
                                int32_t window_left, int32_t window_right, float softcap, bool has_new_kv,
                                bool has_cache_seqlens, bool has_block_table, bool has_sinks, bool has_lse,
                                int32_t num_splits) {
  return guarded([&] {
    std::vector<Buf> ops, res;
    for (size_t i = 0; i < operands.size(); ++i) {
      const auto b = operands.get<ffi::AnyBuffer>(i);
      if (b.has_error()) fail("kvcache: operand " + std::to_string(i) + " is not a buffer");
      ops.push_back(buf_of(*b));
    }
    for (size_t i = 0; i < results.size(); ++i) {
      auto b = results.get<ffi::AnyBuffer>(i);
      if (b.has_error()) fail("kvcache: result " + std::to_string(i) + " is not a buffer");
      res.push_back(buf_of(*b.value()));
    }
    if (ops.size() < 3 || res.empty()) fail("kvcache: expected q, k_cache, v_cache and out at least");
    Attrs a = with_model_options(scale_attrs(causal, has_scale, softmax_scale, batch_invariant), window_left,
                                 window_right, softcap);
    a.has_new_kv = has_new_kv, a.has_cache_seqlens = has_cache_seqlens, a.has_block_table = has_block_table;
    a.has_sinks = has_sinks, a.has_lse = has_lse, a.num_splits = num_splits;
    const ForwardKvcache f = kvcache_call(ops, res, a, Extra::refuse);
    warpattn::forward_kvcache(f.q, f.cache, f.out, f.lse, f.options, stream);
  });
}

// The model options' attributes (issue 19), after each call's own: the same three in the same
// order for every forward and backward target.
template <class B>
auto bind_model_options(B b) {
  return std::move(b)
      .template Attr<int32_t>("window_left")
      .template Attr<int32_t>("window_right")
      .template Attr<float>("softcap");
}

// The bindings, by the names the Python side gives the operands, results and attributes. Each
// is used twice: after the CUDA stream for XLA's GPU (the real handlers), and without it for the
// host check below.
template <class B>
auto bind_forward(B b) {
  return bind_model_options(std::move(b)
      .template Arg<ffi::AnyBuffer>()          // q
      .template Arg<ffi::AnyBuffer>()          // k
      .template Arg<ffi::AnyBuffer>()          // v
      .template OptionalArg<ffi::AnyBuffer>()  // sinks (float32, heads_q)
      .template Ret<ffi::AnyBuffer>()          // out
      .template OptionalRet<ffi::AnyBuffer>()  // lse
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("batch_invariant"));
}

template <class B>
auto bind_backward(B b) {
  return bind_model_options(std::move(b)
      .template Arg<ffi::AnyBuffer>()  // dout
      .template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()  // k
      .template Arg<ffi::AnyBuffer>()  // v
      .template Arg<ffi::AnyBuffer>()  // out
      .template Arg<ffi::AnyBuffer>()          // lse
      .template OptionalArg<ffi::AnyBuffer>()  // the forward's sinks (float32, heads_q)
      .template Ret<ffi::AnyBuffer>()          // dq
      .template Ret<ffi::AnyBuffer>()          // dk
      .template Ret<ffi::AnyBuffer>()          // dv
      .template Ret<ffi::AnyBuffer>()          // workspace (uint8)
      .template OptionalRet<ffi::AnyBuffer>()  // dsinks (float32, heads_q), with the sinks
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("deterministic")
      .template Attr<bool>("batch_invariant"));
}

template <class B>
auto bind_forward_varlen(B b) {
  return bind_model_options(std::move(b)
      .template Arg<ffi::AnyBuffer>()          // q
      .template Arg<ffi::AnyBuffer>()          // k
      .template Arg<ffi::AnyBuffer>()          // v
      .template Arg<ffi::AnyBuffer>()          // cu_seqlens_q
      .template Arg<ffi::AnyBuffer>()          // cu_seqlens_k
      .template OptionalArg<ffi::AnyBuffer>()  // seqused_k, or the sinks (see varlen_optionals)
      .template OptionalArg<ffi::AnyBuffer>()  // the sinks after seqused_k
      .template Ret<ffi::AnyBuffer>()          // out
      .template OptionalRet<ffi::AnyBuffer>()  // lse
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("batch_invariant")
      .template Attr<int64_t>("max_seqlen_q")
      .template Attr<int64_t>("max_seqlen_k"))
      .template Attr<bool>("has_sinks");
}

template <class B>
auto bind_backward_varlen(B b) {
  return bind_model_options(std::move(b)
      .template Arg<ffi::AnyBuffer>()          // dout
      .template Arg<ffi::AnyBuffer>()          // q
      .template Arg<ffi::AnyBuffer>()          // k
      .template Arg<ffi::AnyBuffer>()          // v
      .template Arg<ffi::AnyBuffer>()          // out
      .template Arg<ffi::AnyBuffer>()          // lse
      .template Arg<ffi::AnyBuffer>()          // cu_seqlens_q
      .template Arg<ffi::AnyBuffer>()          // cu_seqlens_k
      .template OptionalArg<ffi::AnyBuffer>()  // seqused_k, or the sinks (see varlen_optionals)
      .template OptionalArg<ffi::AnyBuffer>()  // the sinks after seqused_k
      .template Ret<ffi::AnyBuffer>()          // dq
      .template Ret<ffi::AnyBuffer>()          // dk
      .template Ret<ffi::AnyBuffer>()          // dv
      .template Ret<ffi::AnyBuffer>()          // workspace (uint8)
      .template OptionalRet<ffi::AnyBuffer>()  // dsinks (float32, heads_q), with the sinks
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("deterministic")
      .template Attr<bool>("batch_invariant")
      .template Attr<int64_t>("max_seqlen_q")
      .template Attr<int64_t>("max_seqlen_k"))
      .template Attr<bool>("has_sinks");
}

template <class B>
auto bind_quantize_fp8(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()  // k
      .template Arg<ffi::AnyBuffer>()  // v
      .template Ret<ffi::AnyBuffer>()  // fp8 q (float8_e4m3fn or int8)
      .template Ret<ffi::AnyBuffer>()  // fp8 k
      .template Ret<ffi::AnyBuffer>()  // vt (float8_e4m3fn)
      .template Ret<ffi::AnyBuffer>()  // q_descale (float32)
      .template Ret<ffi::AnyBuffer>()  // k_descale
      .template Ret<ffi::AnyBuffer>()  // v_descale
      .template Attr<bool>("rotate")
      // The uint64 seed's bits as an int64: JAX builds integer attributes through int64, which
      // seeds from 2^63 on overflow.
      .template Attr<int64_t>("seed")
      .template Attr<bool>("per_tensor");
}

template <class B>
auto bind_forward_fp8(B b) {
  return bind_model_options(std::move(b)
      .template Arg<ffi::AnyBuffer>()          // q
      .template Arg<ffi::AnyBuffer>()          // k
      .template Arg<ffi::AnyBuffer>()          // vt
      .template Arg<ffi::AnyBuffer>()          // q_descale
      .template Arg<ffi::AnyBuffer>()          // k_descale
      .template Arg<ffi::AnyBuffer>()          // v_descale
      .template OptionalArg<ffi::AnyBuffer>()  // sinks (float32, heads_q)
      .template Ret<ffi::AnyBuffer>()          // out
      .template OptionalRet<ffi::AnyBuffer>()  // lse
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("batch_invariant"));
}

template <class B>
auto bind_forward_kvcache(B b) {
  return bind_model_options(std::move(b)
      .RemainingArgs()   // q, k_cache, v_cache[, k, v][, cache_seqlens][, block_table][, sinks]
      .RemainingRets()   // out[, lse][, the grown k_cache and v_cache]
      .template Attr<bool>("causal")
      .template Attr<bool>("has_scale")
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("batch_invariant"))
      .template Attr<bool>("has_new_kv")
      .template Attr<bool>("has_cache_seqlens")
      .template Attr<bool>("has_block_table")
      .template Attr<bool>("has_sinks")
      .template Attr<bool>("has_lse")
      .template Attr<int32_t>("num_splits");
}

auto on_gpu() { return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>(); }

XLA_FFI_DEFINE_HANDLER(kForwardHandler, forward_impl, bind_forward(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kBackwardHandler, backward_impl, bind_backward(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kForwardVarlenHandler, forward_varlen_impl, bind_forward_varlen(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kBackwardVarlenHandler, backward_varlen_impl, bind_backward_varlen(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kQuantizeFp8Handler, quantize_fp8_impl, bind_quantize_fp8(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kForwardFp8Handler, forward_fp8_impl, bind_forward_fp8(on_gpu()));
XLA_FFI_DEFINE_HANDLER(kForwardKvcacheHandler, forward_kvcache_impl, bind_forward_kvcache(on_gpu()));

// The host check: the same handlers without a stream, to be registered for XLA's CPU platform by
// tests on machines without a GPU. They decode the call frame, build the views (folding vmap's
// axes, placing the workspace) and run every argument rule of the library call, which then stops
// at its device check (XLA's CPU buffers are not device memory): so the message says whether
// the call got that far. Nothing is launched or written.
constexpr auto forward_on_host = [](auto... a) { return forward_impl(nullptr, a...); };
constexpr auto backward_on_host = [](auto... a) { return backward_impl(nullptr, a...); };
constexpr auto forward_varlen_on_host = [](auto... a) { return forward_varlen_impl(nullptr, a...); };
constexpr auto backward_varlen_on_host = [](auto... a) { return backward_varlen_impl(nullptr, a...); };
constexpr auto quantize_fp8_on_host = [](auto... a) { return quantize_fp8_impl(nullptr, a...); };
constexpr auto forward_fp8_on_host = [](auto... a) { return forward_fp8_impl(nullptr, a...); };
constexpr auto forward_kvcache_on_host = [](auto... a) { return forward_kvcache_impl(nullptr, a...); };
XLA_FFI_DEFINE_HANDLER(kForwardHostCheck, forward_on_host, bind_forward(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kBackwardHostCheck, backward_on_host, bind_backward(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kForwardVarlenHostCheck, forward_varlen_on_host, bind_forward_varlen(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kBackwardVarlenHostCheck, backward_varlen_on_host, bind_backward_varlen(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kQuantizeFp8HostCheck, quantize_fp8_on_host, bind_quantize_fp8(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kForwardFp8HostCheck, forward_fp8_on_host, bind_forward_fp8(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kForwardKvcacheHostCheck, forward_kvcache_on_host, bind_forward_kvcache(ffi::Ffi::Bind()));

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
  a.batch_invariant = attr<bool>(d, "batch_invariant", false);
  a.rotate = attr<bool>(d, "rotate", true);
  a.seed = static_cast<uint64_t>(attr<int64_t>(d, "seed", 0));
  a.per_tensor = attr<bool>(d, "per_tensor", false);
  a.max_seqlen_q = attr<int64_t>(d, "max_seqlen_q", 0);
  a.max_seqlen_k = attr<int64_t>(d, "max_seqlen_k", 0);
  a.window_left = attr<int32_t>(d, "window_left", -1);
  a.window_right = attr<int32_t>(d, "window_right", -1);
  a.softcap = attr<float>(d, "softcap", 0.0f);
  a.has_sinks = attr<bool>(d, "has_sinks", false);
  a.has_new_kv = attr<bool>(d, "has_new_kv", false);
  a.has_cache_seqlens = attr<bool>(d, "has_cache_seqlens", false);
  a.has_block_table = attr<bool>(d, "has_block_table", false);
  a.has_lse = attr<bool>(d, "has_lse", false);
  a.num_splits = attr<int32_t>(d, "num_splits", 0);
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
      // Dense: q, k, v[, sinks]. Packed: q, k, v, cu_seqlens_q, cu_seqlens_k[, seqused_k][, sinks].
      expect_count(target, "operands", ops.size(), varlen ? 5 : 3, varlen ? 7 : 4);
      expect_count(target, "results", res.size(), 1, 2);
      const size_t required = varlen ? 5 : 3;
      const Buf* first = ops.size() > required ? &ops[required] : nullptr;
      const Buf* second = ops.size() > required + 1 ? &ops[required + 1] : nullptr;
      const VarlenOptionals given =
          varlen ? varlen_optionals(first, second, a.has_sinks) : VarlenOptionals{nullptr, first};
      const Forward f = forward_call(ops[0], ops[1], ops[2], res[0], res.size() > 1 ? &res[1] : nullptr, given.sinks,
                                     a, varlen, Extra::refuse);
      if (!varlen) {
        warpattn::validate_forward(f.q, f.k, f.v, f.out, f.lse, f.options);
      } else {
        const warpattn::VarlenBatch batch = varlen_batch(ops[3], ops[4], given.seqused_k, a);
        warpattn::validate_forward_varlen(f.q, f.k, f.v, f.out, f.lse, batch, f.options);
      }
    } else if (target == kBackward || target == kBackwardVarlen) {
      const bool varlen = target == kBackwardVarlen;
      // Dense: dout, q, k, v, out, lse[, sinks]. Packed: those (without the sinks), cu_seqlens_q,
      // cu_seqlens_k[, seqused_k][, sinks]. Results: dq, dk, dv, workspace[, dsinks].
      expect_count(target, "operands", ops.size(), varlen ? 8 : 6, varlen ? 10 : 7);
      expect_count(target, "results", res.size(), 4, 5);
      const size_t required = varlen ? 8 : 6;
      const Buf* first = ops.size() > required ? &ops[required] : nullptr;
      const Buf* second = ops.size() > required + 1 ? &ops[required + 1] : nullptr;
      const VarlenOptionals given =
          varlen ? varlen_optionals(first, second, a.has_sinks) : VarlenOptionals{nullptr, first};
      const Backward b =
          backward_call(ops.data(), res.data(), given.sinks, res.size() > 4 ? &res[4] : nullptr, a, varlen,
                        Extra::refuse);
      if (!varlen) {
        warpattn::validate_backward(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, b.options, b.workspace);
      } else {
        const warpattn::VarlenBatch batch = varlen_batch(ops[6], ops[7], given.seqused_k, a);
        warpattn::validate_backward_varlen(b.dout, b.q, b.k, b.v, b.out, b.lse, b.dq, b.dk, b.dv, batch, b.options,
                                           b.workspace);
      }
    } else if (target == kQuantizeFp8) {
      expect_count(target, "operands", ops.size(), 3, 3);
      expect_count(target, "results", res.size(), 6, 6);
      const Quantize c = quantize_call(ops.data(), res.data(), a, Extra::refuse);
      warpattn::validate_quantize_fp8(c.q, c.k, c.v, c.fp8, c.options);
    } else if (target == kForwardFp8) {
      expect_count(target, "operands", ops.size(), 6, 7);
      expect_count(target, "results", res.size(), 1, 2);
      const ForwardFp8 f = forward_fp8_call(ops.data(), res[0], res.size() > 1 ? &res[1] : nullptr,
                                            ops.size() > 6 ? &ops[6] : nullptr, a, Extra::refuse);
      warpattn::validate_forward_fp8(f.fp8, f.out, f.lse, f.options);
    } else if (target == kForwardKvcache) {
      expect_count(target, "operands", ops.size(), 3, 8);
      expect_count(target, "results", res.size(), 1, 4);
      const std::vector<Buf> operands(ops.data(), ops.data() + ops.size());
      const std::vector<Buf> results(res.data(), res.data() + res.size());
      const ForwardKvcache f = kvcache_call(operands, results, a, Extra::refuse);
      warpattn::validate_forward_kvcache(f.q, f.cache, f.out, f.lse, f.options);
    } else {
      throw nb::value_error(("jax_ffi_validate: no warpattn FFI target named " + target).c_str());
    }
  } catch (const warpattn::Error& e) {
    throw nb::value_error(e.what());
  }
}

// has_sinks in attrs: the call has sinks, whose gradient's partial sums take workspace too (the
// library sizes it by whether sinks are given, not by their values: a made-up address will do).
size_t workspace_bytes(const std::string& target, nb::handle q_spec, int64_t batch, const nb::dict& attrs) {
  const Specs q(nb::make_tuple(q_spec), "q", 0);
  const Attrs a = attrs_of(attrs);
  warpattn::BackwardOptions options = backward_options(a);
  if (a.has_sinks) {
    const int64_t heads = q[0].rank >= 2 ? q[0].dims[q[0].rank - 2] : 0;
    options.sinks = warpattn::make_contiguous_view(reinterpret_cast<void*>(uintptr_t{1} << 52), DType::f32, 1, &heads);
  }
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

nb::dict targets_of(std::initializer_list<std::pair<const char*, XLA_FFI_Handler*>> handlers) {
  nb::dict targets;
  for (const auto& [name, handler] : handlers) targets[name] = capsule_of(handler);
  return targets;
}

}  // namespace

void add_jax_ffi(nb::module_& m) {
  m.def(
      "jax_ffi_targets",
      [] {
        return targets_of({{kForward, kForwardHandler},
                           {kBackward, kBackwardHandler},
                           {kForwardVarlen, kForwardVarlenHandler},
                           {kBackwardVarlen, kBackwardVarlenHandler},
                           {kQuantizeFp8, kQuantizeFp8Handler},
                           {kForwardFp8, kForwardFp8Handler},
                           {kForwardKvcache, kForwardKvcacheHandler}});
      },
      "{XLA FFI target name: PyCapsule of its handler}, for jax.ffi.register_ffi_target(..., platform='CUDA').");
  m.def(
      "jax_ffi_host_check_targets",
      [] {
        return targets_of({{kForward, kForwardHostCheck},
                           {kBackward, kBackwardHostCheck},
                           {kForwardVarlen, kForwardVarlenHostCheck},
                           {kBackwardVarlen, kBackwardVarlenHostCheck},
                           {kQuantizeFp8, kQuantizeFp8HostCheck},
                           {kForwardFp8, kForwardFp8HostCheck},
                           {kForwardKvcache, kForwardKvcacheHostCheck}});
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
        "sequences (varlen); attrs as the call's, and has_sinks when it has sinks.");
}

}  // namespace warpattn_python
