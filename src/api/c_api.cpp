// The C ABI (warpattn/warpattn_c.h): translates C structs into TensorViews, calls
// warpattn::forward or warpattn::backward, and turns exceptions into status codes, because an
// exception must never cross an extern "C" boundary (ctypes would abort the whole Python process).
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string>

#include "api/problem.hpp"
#include "warpattn/warpattn.hpp"
#include "warpattn/warpattn_c.h"

namespace {

static_assert(static_cast<int>(warpattn::DType::f16) == WARPATTN_DTYPE_F16);
static_assert(static_cast<int>(warpattn::DType::bf16) == WARPATTN_DTYPE_BF16);
static_assert(static_cast<int>(warpattn::DType::f32) == WARPATTN_DTYPE_F32);
static_assert(static_cast<int>(warpattn::DType::s32) == WARPATTN_DTYPE_S32);
// The ctypes mirror in python/warpattn/bench.py (its --lib mode) hard-codes this layout.
static_assert(sizeof(void*) != 8 || sizeof(warpattn_tensor) == 80,
              "warpattn_tensor layout changed: update warpattn_c.h's comment and FFI mirrors");

// Only what the C struct can get wrong and TensorView cannot express is checked here (a NULL
// struct, a dtype code outside the enum, a rank that would index past shape[4]); every other
// rule is warpattn::forward's or warpattn::backward's, so the messages stay in one place.
warpattn::TensorView to_view(const warpattn_tensor* t, const char* name) {
  if (t == nullptr) throw warpattn::Error(std::string(name) + ": expected a tensor, got NULL");
  if ((t->dtype < WARPATTN_DTYPE_F16 || t->dtype > WARPATTN_DTYPE_F32) && t->dtype != WARPATTN_DTYPE_S32) {
    throw warpattn::Error(std::string(name) +
                          ".dtype: expected 0 (f16), 1 (bf16), 2 (f32) or 5 (s32), got " +
                          std::to_string(t->dtype));
  }
  if (t->rank < 0 || t->rank > 4) {
    throw warpattn::Error(std::string(name) + ".rank: expected 0 to 4, got " +
                          std::to_string(t->rank));
  }
  warpattn::TensorView view;
  view.data = t->data;
  view.dtype = static_cast<warpattn::DType>(t->dtype);
  view.rank = t->rank;
  for (int i = 0; i < t->rank; ++i) {
    view.shape[i] = t->shape[i];
    view.stride[i] = t->stride[i];
  }
  return view;
}

// Copies as much of the message as fits and always terminates it (when there is room at all).
void copy_message(const char* message, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  const size_t n = std::min(std::strlen(message), err_len - 1);
  std::memcpy(err, message, n);
  err[n] = '\0';
}

// One C entry: clears err, runs `work`, and turns whatever it throws into a status code and
// the message. `entry` names the function in the message of an exception that carries none.
template <class Work>
int run_entry(const char* entry, char* err, size_t err_len, const Work& work) {
  copy_message("", err, err_len);
  try {
    work();
    return WARPATTN_OK;
  } catch (const warpattn::Error& e) {
    copy_message(e.what(), err, err_len);
    return WARPATTN_INVALID;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, err_len);
    return WARPATTN_INTERNAL_ERROR;
  } catch (...) {
    if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s: unknown exception", entry);
    return WARPATTN_INTERNAL_ERROR;
  }
}

std::optional<float> scale_option(int has_scale, float softmax_scale) {
  return has_scale ? std::optional<float>(softmax_scale) : std::nullopt;
}

std::optional<warpattn::TensorView> optional_view(const warpattn_tensor* t, const char* name) {
  if (t == nullptr) return std::nullopt;
  return to_view(t, name);
}

warpattn::BackwardOptions backward_options(int causal, int deterministic, int has_scale = 0,
                                           float softmax_scale = 0.f) {
  warpattn::BackwardOptions options;
  options.causal = causal != 0;
  options.deterministic = deterministic != 0;
  options.softmax_scale = scale_option(has_scale, softmax_scale);
  return options;
}

warpattn::VarlenBatch varlen_batch(const warpattn_tensor* cu_seqlens_q, const warpattn_tensor* cu_seqlens_k,
                                   const warpattn_tensor* seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  warpattn::VarlenBatch batch;
  batch.cu_seqlens_q = to_view(cu_seqlens_q, "cu_seqlens_q");
  batch.cu_seqlens_k = to_view(cu_seqlens_k, "cu_seqlens_k");
  batch.seqused_k = optional_view(seqused_k, "seqused_k");
  batch.max_seqlen_q = max_seqlen_q;
  batch.max_seqlen_k = max_seqlen_k;
  return batch;
}

std::optional<warpattn::Workspace> workspace_of(void* workspace, size_t bytes) {
  if (workspace == nullptr) return std::nullopt;
  return warpattn::Workspace{workspace, bytes};
}

// The nine tensors of a backward call. Braces convert in argument order, so the first bad struct
// is the one reported.
warpattn::detail::BackwardTensors backward_tensors(const warpattn_tensor* dout, const warpattn_tensor* q,
                                                   const warpattn_tensor* k, const warpattn_tensor* v,
                                                   const warpattn_tensor* out, const warpattn_tensor* lse,
                                                   const warpattn_tensor* dq, const warpattn_tensor* dk,
                                                   const warpattn_tensor* dv) {
  return {to_view(dout, "dout"), to_view(q, "q"),   to_view(k, "k"),   to_view(v, "v"),   to_view(out, "out"),
          to_view(lse, "lse"),   to_view(dq, "dq"), to_view(dk, "dk"), to_view(dv, "dv")};
}

}  // namespace

extern "C" int warpattn_forward(const warpattn_tensor* q, const warpattn_tensor* k,
                                const warpattn_tensor* v, const warpattn_tensor* out,
                                const warpattn_tensor* lse, int has_scale, float softmax_scale,
                                int causal, void* stream, char* err, size_t err_len) {
  return run_entry("warpattn_forward", err, err_len, [&] {
    warpattn::ForwardOptions options;
    options.softmax_scale = scale_option(has_scale, softmax_scale);
    options.causal = causal != 0;
    warpattn::forward(to_view(q, "q"), to_view(k, "k"), to_view(v, "v"), to_view(out, "out"),
                      optional_view(lse, "lse"), options, static_cast<cudaStream_t>(stream));
  });
}

extern "C" int warpattn_forward_varlen(const warpattn_tensor* q, const warpattn_tensor* k, const warpattn_tensor* v,
                                       const warpattn_tensor* out, const warpattn_tensor* lse,
                                       const warpattn_tensor* cu_seqlens_q, const warpattn_tensor* cu_seqlens_k,
                                       const warpattn_tensor* seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                       int has_scale, float softmax_scale, int causal, void* stream, char* err,
                                       size_t err_len) {
  return run_entry("warpattn_forward_varlen", err, err_len, [&] {
    warpattn::ForwardOptions options;
    options.softmax_scale = scale_option(has_scale, softmax_scale);
    options.causal = causal != 0;
    const warpattn::TensorView vq = to_view(q, "q"), vk = to_view(k, "k"), vv = to_view(v, "v"),
                               vo = to_view(out, "out");
    const std::optional<warpattn::TensorView> vl = optional_view(lse, "lse");
    const warpattn::VarlenBatch batch = varlen_batch(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
    warpattn::forward_varlen(vq, vk, vv, vo, vl, batch, options, static_cast<cudaStream_t>(stream));
  });
}

namespace {

// The caller's options struct, as far as its version has fields (struct_size).
warpattn::ForwardOptions forward_options(const warpattn_forward_options* o) {
  if (o == nullptr) throw warpattn::Error("options: expected a warpattn_forward_options, got NULL");
  constexpr size_t kFirstVersion = offsetof(warpattn_forward_options, sinks) + sizeof(o->sinks);
  if (o->struct_size < kFirstVersion) {
    std::ostringstream m;
    m << "options: struct_size " << o->struct_size << " is smaller than any version of warpattn_forward_options ("
      << kFirstVersion << " bytes): fill it with warpattn_forward_options_init first";
    throw warpattn::Error(m.str());
  }
  warpattn::ForwardOptions options;
  options.softmax_scale = scale_option(o->has_scale, o->softmax_scale);
  options.causal = o->causal != 0;
  options.batch_invariant = o->batch_invariant != 0;
  options.window_left = o->window_left;
  options.window_right = o->window_right;
  options.softcap = o->softcap;
  options.sinks = optional_view(o->sinks, "sinks");
  return options;
}

// The backward's options for a forward call made with `o`, and the sinks' gradient.
warpattn::BackwardOptions backward_options(const warpattn_forward_options* o, int deterministic,
                                           const warpattn_tensor* dsinks) {
  const warpattn::ForwardOptions f = forward_options(o);
  warpattn::BackwardOptions b;
  b.sinks = f.sinks;
  b.dsinks = optional_view(dsinks, "dsinks");
  b.softmax_scale = f.softmax_scale;
  b.causal = f.causal;
  b.deterministic = deterministic != 0;
  b.batch_invariant = f.batch_invariant;
  b.window_left = f.window_left, b.window_right = f.window_right;
  b.softcap = f.softcap;
  return b;
}

}  // namespace

extern "C" int warpattn_backward_ex(const warpattn_tensor* dout, const warpattn_tensor* q, const warpattn_tensor* k,
                                    const warpattn_tensor* v, const warpattn_tensor* out, const warpattn_tensor* lse,
                                    const warpattn_tensor* dq, const warpattn_tensor* dk, const warpattn_tensor* dv,
                                    const warpattn_tensor* dsinks, const warpattn_forward_options* options,
                                    int deterministic, void* workspace, size_t workspace_bytes, void* stream,
                                    char* err, size_t err_len) {
  return run_entry("warpattn_backward_ex", err, err_len, [&] {
    const warpattn::BackwardOptions b = backward_options(options, deterministic, dsinks);
    const std::optional<warpattn::Workspace> given = workspace_of(workspace, workspace_bytes);
    const warpattn::detail::BackwardTensors t = backward_tensors(dout, q, k, v, out, lse, dq, dk, dv);
    warpattn::backward(t.dout, t.q, t.k, t.v, t.out, t.lse, t.dq, t.dk, t.dv, b, given,
                       static_cast<cudaStream_t>(stream));
  });
}

extern "C" int warpattn_backward_ex_workspace_bytes(const warpattn_tensor* q, const warpattn_forward_options* options,
                                                    int deterministic, size_t* bytes, char* err, size_t err_len) {
  return run_entry("warpattn_backward_ex_workspace_bytes", err, err_len, [&] {
    if (bytes == nullptr) throw warpattn::Error("bytes: expected a pointer to receive the size, got NULL");
    *bytes = warpattn::backward_workspace_bytes(to_view(q, "q"), backward_options(options, deterministic, nullptr));
  });
}

extern "C" void warpattn_forward_options_init(warpattn_forward_options* o) {
  if (o == nullptr) return;
  *o = warpattn_forward_options{};
  o->struct_size = sizeof(warpattn_forward_options);
  o->window_left = o->window_right = -1;
}

extern "C" int warpattn_forward_ex(const warpattn_tensor* q, const warpattn_tensor* k, const warpattn_tensor* v,
                                   const warpattn_tensor* out, const warpattn_tensor* lse,
                                   const warpattn_forward_options* options, void* stream, char* err, size_t err_len) {
  return run_entry("warpattn_forward_ex", err, err_len, [&] {
    warpattn::forward(to_view(q, "q"), to_view(k, "k"), to_view(v, "v"), to_view(out, "out"),
                      optional_view(lse, "lse"), forward_options(options), static_cast<cudaStream_t>(stream));
  });
}

extern "C" int warpattn_forward_varlen_ex(const warpattn_tensor* q, const warpattn_tensor* k, const warpattn_tensor* v,
                                          const warpattn_tensor* out, const warpattn_tensor* lse,
                                          const warpattn_tensor* cu_seqlens_q, const warpattn_tensor* cu_seqlens_k,
                                          const warpattn_tensor* seqused_k, int64_t max_seqlen_q,
                                          int64_t max_seqlen_k, const warpattn_forward_options* options,
                                          void* stream, char* err, size_t err_len) {
  return run_entry("warpattn_forward_varlen_ex", err, err_len, [&] {
    const warpattn::VarlenBatch batch = varlen_batch(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
    warpattn::forward_varlen(to_view(q, "q"), to_view(k, "k"), to_view(v, "v"), to_view(out, "out"),
                             optional_view(lse, "lse"), batch, forward_options(options),
                             static_cast<cudaStream_t>(stream));
  });
}

namespace {
// The KvCache of the two KV-cache entries (16-bit and FP8 caches): the same arguments, views of
// the same names in the messages.
warpattn::KvCache kv_cache(const warpattn_tensor* k_cache, const warpattn_tensor* v_cache,
                           const warpattn_tensor* k_new, const warpattn_tensor* v_new,
                           const warpattn_tensor* cache_seqlens, const warpattn_tensor* block_table, int num_splits) {
  warpattn::KvCache cache;
  cache.k_cache = to_view(k_cache, "k_cache");
  cache.v_cache = to_view(v_cache, "v_cache");
  cache.k = optional_view(k_new, "k_new");
  cache.v = optional_view(v_new, "v_new");
  cache.cache_seqlens = optional_view(cache_seqlens, "cache_seqlens");
  cache.block_table = optional_view(block_table, "block_table");
  cache.num_splits = num_splits;
  return cache;
}
}  // namespace

extern "C" int warpattn_forward_kvcache(const warpattn_tensor* q, const warpattn_tensor* k_cache,
                                        const warpattn_tensor* v_cache, const warpattn_tensor* k_new,
                                        const warpattn_tensor* v_new, const warpattn_tensor* cache_seqlens,
                                        const warpattn_tensor* block_table, int num_splits,
                                        const warpattn_tensor* out, const warpattn_tensor* lse,
                                        const warpattn_forward_options* options, void* stream, char* err,
                                        size_t err_len) {
  return run_entry("warpattn_forward_kvcache", err, err_len, [&] {
    const warpattn::KvCache cache = kv_cache(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, num_splits);
    warpattn::forward_kvcache(to_view(q, "q"), cache, to_view(out, "out"), optional_view(lse, "lse"),
                              forward_options(options), static_cast<cudaStream_t>(stream));
  });
}

extern "C" int warpattn_forward_kvcache_fp8(const warpattn_tensor* q, const warpattn_tensor* k_cache,
                                            const warpattn_tensor* v_cache, const warpattn_tensor* k_descale,
                                            const warpattn_tensor* v_descale, const warpattn_tensor* k_new,
                                            const warpattn_tensor* v_new, const warpattn_tensor* cache_seqlens,
                                            const warpattn_tensor* block_table, int num_splits,
                                            const warpattn_tensor* out, const warpattn_tensor* lse,
                                            const warpattn_forward_options* options, void* stream, char* err,
                                            size_t err_len) {
  return run_entry("warpattn_forward_kvcache_fp8", err, err_len, [&] {
    warpattn::KvCache cache = kv_cache(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, num_splits);
    cache.k_descale = to_view(k_descale, "k_descale");
    cache.v_descale = to_view(v_descale, "v_descale");
    warpattn::forward_kvcache(to_view(q, "q"), cache, to_view(out, "out"), optional_view(lse, "lse"),
                              forward_options(options), static_cast<cudaStream_t>(stream));
  });
}

extern "C" int warpattn_backward(const warpattn_tensor* dout, const warpattn_tensor* q,
                                 const warpattn_tensor* k, const warpattn_tensor* v,
                                 const warpattn_tensor* out, const warpattn_tensor* lse,
                                 const warpattn_tensor* dq, const warpattn_tensor* dk,
                                 const warpattn_tensor* dv, int has_scale, float softmax_scale,
                                 int causal, int deterministic, void* workspace,
                                 size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  return run_entry("warpattn_backward", err, err_len, [&] {
    const warpattn::BackwardOptions options = backward_options(causal, deterministic, has_scale, softmax_scale);
    const std::optional<warpattn::Workspace> given = workspace_of(workspace, workspace_bytes);
    const warpattn::detail::BackwardTensors t = backward_tensors(dout, q, k, v, out, lse, dq, dk, dv);
    warpattn::backward(t.dout, t.q, t.k, t.v, t.out, t.lse, t.dq, t.dk, t.dv, options, given,
                       static_cast<cudaStream_t>(stream));
  });
}

extern "C" int warpattn_backward_workspace_bytes(const warpattn_tensor* q, int causal, int deterministic,
                                                 size_t* bytes, char* err, size_t err_len) {
  return run_entry("warpattn_backward_workspace_bytes", err, err_len, [&] {
    if (bytes == nullptr) throw warpattn::Error("bytes: expected a pointer to receive the size, got NULL");
    *bytes = warpattn::backward_workspace_bytes(to_view(q, "q"), backward_options(causal, deterministic));
  });
}

extern "C" int warpattn_backward_varlen(
    const warpattn_tensor* dout, const warpattn_tensor* q, const warpattn_tensor* k, const warpattn_tensor* v,
    const warpattn_tensor* out, const warpattn_tensor* lse, const warpattn_tensor* dq, const warpattn_tensor* dk,
    const warpattn_tensor* dv, const warpattn_tensor* cu_seqlens_q, const warpattn_tensor* cu_seqlens_k,
    const warpattn_tensor* seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, int has_scale, float softmax_scale,
    int causal, int deterministic, void* workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  return run_entry("warpattn_backward_varlen", err, err_len, [&] {
    const warpattn::BackwardOptions options = backward_options(causal, deterministic, has_scale, softmax_scale);
    const std::optional<warpattn::Workspace> given = workspace_of(workspace, workspace_bytes);
    const warpattn::detail::BackwardTensors t = backward_tensors(dout, q, k, v, out, lse, dq, dk, dv);
    const warpattn::VarlenBatch batch = varlen_batch(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
    warpattn::backward_varlen(t.dout, t.q, t.k, t.v, t.out, t.lse, t.dq, t.dk, t.dv, batch, options, given,
                              static_cast<cudaStream_t>(stream));
  });
}

extern "C" int warpattn_backward_varlen_workspace_bytes(const warpattn_tensor* q, int64_t batch, int causal,
                                                        int deterministic, size_t* bytes, char* err, size_t err_len) {
  return run_entry("warpattn_backward_varlen_workspace_bytes", err, err_len, [&] {
    if (bytes == nullptr) throw warpattn::Error("bytes: expected a pointer to receive the size, got NULL");
    *bytes = warpattn::backward_varlen_workspace_bytes(to_view(q, "q"), batch, backward_options(causal, deterministic));
  });
}

extern "C" size_t warpattn_tensor_struct_size(void) { return sizeof(warpattn_tensor); }
