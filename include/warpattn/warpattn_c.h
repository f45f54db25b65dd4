/* warpattn: a plain C ABI over warpattn::forward and warpattn::backward.
 *
 * Why it exists: Python's ctypes (and any other FFI) cannot call C++ functions that take
 * std::optional or throw exceptions. This header exposes the same forward and backward passes
 * through C types only: a tensor is a struct of pointer, dtype code, rank, shape and strides, and
 * errors come back as a status code plus a message copied into a caller-owned buffer.
 *
 * The struct layout is part of the ABI (x86-64 / aarch64 LP64: 80 bytes, no padding):
 *   offset 0  void*   data
 *   offset 8  int     dtype   (WARPATTN_DTYPE_*)
 *   offset 12 int     rank
 *   offset 16 int64_t shape[4]
 *   offset 48 int64_t stride[4]   (in elements, not bytes)
 * warpattn_tensor_struct_size() lets an FFI binding check that its mirror agrees.
 *
 * Semantics, layouts and rules are those of warpattn::forward and warpattn::backward in
 * warpattn/warpattn.hpp: q, out, dout, dq (B, Sq, Hq, D), k, v, dk, dv (B, Sk, Hkv, D), lse
 * (B, Hq, Sq) fp32.
 */
#ifndef WARPATTN_WARPATTN_C_H
#define WARPATTN_WARPATTN_C_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define WARPATTN_C_API __declspec(dllexport)
#else
#define WARPATTN_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Element types; the values equal warpattn::DType's. */
enum {
  WARPATTN_DTYPE_F16 = 0,
  WARPATTN_DTYPE_BF16 = 1,
  WARPATTN_DTYPE_F32 = 2,
  WARPATTN_DTYPE_S32 = 5 /* int32: the sequence offsets of packed batches */
};

/* Return codes of every entry below that returns an int. */
enum {
  WARPATTN_OK = 0,             /* done: launched (asynchronously) on the stream, or computed */
  WARPATTN_INVALID = 1,        /* warpattn::Error: invalid argument or CUDA failure; see err */
  WARPATTN_INTERNAL_ERROR = 2  /* any other exception (out of host memory, ...); see err */
};

typedef struct {
  void* data;        /* device pointer */
  int dtype;         /* WARPATTN_DTYPE_*: 0 f16, 1 bf16, 2 f32 */
  int rank;          /* 4 for q, k, v, out and the gradients; 3 for lse */
  int64_t shape[4];  /* entries past rank are ignored */
  int64_t stride[4]; /* in elements; entries past rank are ignored */
} warpattn_tensor;

/* out = softmax(scale * q k^T [+ causal mask, bottom-right]) v.
 *   lse:        NULL for none.
 *   has_scale:  0 uses 1/sqrt(head_dim); otherwise softmax_scale is used.
 *   causal:     0 or non-zero.
 *   stream:     a cudaStream_t (NULL = the legacy default stream).
 *   err:        receives a NUL-terminated message on failure (truncated to err_len - 1
 *               bytes) and an empty string on success; may be NULL when err_len is 0.
 * Returns WARPATTN_OK, WARPATTN_INVALID or WARPATTN_INTERNAL_ERROR. Never throws; does not
 * synchronise the stream. On failure nothing has been launched for invalid arguments. */
WARPATTN_C_API int warpattn_forward(const warpattn_tensor* q, const warpattn_tensor* k,
                                    const warpattn_tensor* v, const warpattn_tensor* out,
                                    const warpattn_tensor* lse, int has_scale,
                                    float softmax_scale, int causal, void* stream, char* err,
                                    size_t err_len);

/* Every option of the forward calls (warpattn::ForwardOptions), for warpattn_forward_ex and
 * warpattn_forward_varlen_ex. Fill it with warpattn_forward_options_init (the defaults: the
 * scale 1/sqrt(head_dim), no mask, no window: window_left = window_right = -1, since 0 would be
 * a window of one key), then change what you need. struct_size is how the library knows which
 * fields the caller's version has: later versions add fields at the end only. */
typedef struct {
  size_t struct_size;       /* sizeof(warpattn_forward_options), set by the init function */
  int has_scale;            /* 0: 1/sqrt(head_dim); otherwise softmax_scale */
  float softmax_scale;
  int causal;               /* bottom-right aligned */
  int batch_invariant;      /* a row's bits independent of the rest of the batch (README: modes) */
  int window_left;          /* sliding window, FlashAttention's window_size: -1 unbounded */
  int window_right;         /* with causal: -1 or 0 */
  float softcap;            /* 0: off; > 0: softcap * tanh(score / softcap) (16-bit forward only) */
  const warpattn_tensor* sinks; /* NULL, or (Hq) fp32 logits joining each head's denominator */
} warpattn_forward_options;

/* The defaults, with struct_size set. */
WARPATTN_C_API void warpattn_forward_options_init(warpattn_forward_options* options);

/* warpattn_forward and warpattn_forward_varlen with every option (options may not be NULL).
 * Other arguments and the return value as theirs. */
WARPATTN_C_API int warpattn_forward_ex(const warpattn_tensor* q, const warpattn_tensor* k,
                                       const warpattn_tensor* v, const warpattn_tensor* out,
                                       const warpattn_tensor* lse, const warpattn_forward_options* options,
                                       void* stream, char* err, size_t err_len);
WARPATTN_C_API int warpattn_forward_varlen_ex(const warpattn_tensor* q, const warpattn_tensor* k,
                                              const warpattn_tensor* v, const warpattn_tensor* out,
                                              const warpattn_tensor* lse, const warpattn_tensor* cu_seqlens_q,
                                              const warpattn_tensor* cu_seqlens_k, const warpattn_tensor* seqused_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k,
                                              const warpattn_forward_options* options, void* stream, char* err,
                                              size_t err_len);

/* warpattn::forward_kvcache: q, out (B, Sq, Hq, D) attend each sequence's KV cache, k_cache and
 * v_cache dense (B, S_cache, Hkv, D) or, with block_table (B, max_pages) int32, paged (num_pages,
 * page_size, Hkv, D); cache_seqlens (B) int32 or NULL (full caches); k_new and v_new (B, S_new,
 * Hkv, D), both or NULL, appended at cache_seqlens before attending; lse (B, Hq, Sq) or NULL.
 * num_splits: as KvCache's (0: chosen from the shape). options may not be NULL. The return value
 * as warpattn_forward's. */
WARPATTN_C_API int warpattn_forward_kvcache(const warpattn_tensor* q, const warpattn_tensor* k_cache,
                                            const warpattn_tensor* v_cache, const warpattn_tensor* k_new,
                                            const warpattn_tensor* v_new, const warpattn_tensor* cache_seqlens,
                                            const warpattn_tensor* block_table, int num_splits,
                                            const warpattn_tensor* out, const warpattn_tensor* lse,
                                            const warpattn_forward_options* options, void* stream, char* err,
                                            size_t err_len);

/* warpattn_forward_kvcache over an E4M3 cache (KvCache::k_descale in warpattn.hpp): k_cache
 * float8_e4m3fn in the 16-bit cache's layout, v_cache float8_e4m3fn transposed in slices of 16
 * keys, dense (B, Hkv, S_cache / 16, 16 D) or paged (num_pages, Hkv, page_size / 16, 16 D)
 * (KvCache::v_cache's layout in warpattn.hpp), S_cache or page_size a multiple of 16;
 * k_descale and v_descale (Hkv) float32 (stride 0: one for all heads); q, out, k_new and v_new
 * fp16 or bf16, the new rows quantised into the cache. The rest as warpattn_forward_kvcache's. */
WARPATTN_C_API int warpattn_forward_kvcache_fp8(const warpattn_tensor* q, const warpattn_tensor* k_cache,
                                                const warpattn_tensor* v_cache, const warpattn_tensor* k_descale,
                                                const warpattn_tensor* v_descale, const warpattn_tensor* k_new,
                                                const warpattn_tensor* v_new, const warpattn_tensor* cache_seqlens,
                                                const warpattn_tensor* block_table, int num_splits,
                                                const warpattn_tensor* out, const warpattn_tensor* lse,
                                                const warpattn_forward_options* options, void* stream, char* err,
                                                size_t err_len);

/* The gradients of warpattn_forward(q, k, v) -> out, given dout = dL/d(out): dq, dk and dv.
 *   lse:              the forward's log-sum-exp (not optional here).
 *   has_scale, softmax_scale, causal: those of the forward call.
 *   deterministic:    non-zero for the same bits on every run (dq's partial sums added in a
 *                     fixed order; slower).
 *   workspace:        NULL: none, the call takes it from warpattn's memory pool in stream
 *                     order (refused while the stream is being captured into a CUDA graph);
 *                     otherwise device memory of workspace_bytes bytes, at least
 *                     warpattn_backward_workspace_bytes, 256-byte aligned, used by nothing else
 *                     until the work enqueued on the stream has finished.
 *   stream, err, err_len: as warpattn_forward.
 * Returns WARPATTN_OK, WARPATTN_INVALID or WARPATTN_INTERNAL_ERROR. Never throws; does not
 * synchronise the stream. On failure nothing has been launched for invalid arguments. */
WARPATTN_C_API int warpattn_backward(const warpattn_tensor* dout, const warpattn_tensor* q,
                                     const warpattn_tensor* k, const warpattn_tensor* v,
                                     const warpattn_tensor* out, const warpattn_tensor* lse,
                                     const warpattn_tensor* dq, const warpattn_tensor* dk,
                                     const warpattn_tensor* dv, int has_scale,
                                     float softmax_scale, int causal, int deterministic,
                                     void* workspace, size_t workspace_bytes, void* stream,
                                     char* err, size_t err_len);

/* warpattn_backward for a forward call made with warpattn_forward_ex's options (its scale,
 * causal, batch_invariant, window, softcap and sinks). dsinks: the sinks' gradient, (Hq) fp32,
 * written (required with sinks, NULL without). deterministic: as warpattn_backward's
 * (batch_invariant implies it). The workspace: NULL, or warpattn_backward_ex_workspace_bytes.
 * Other arguments and the return value as warpattn_backward's. */
WARPATTN_C_API int warpattn_backward_ex(const warpattn_tensor* dout, const warpattn_tensor* q,
                                        const warpattn_tensor* k, const warpattn_tensor* v,
                                        const warpattn_tensor* out, const warpattn_tensor* lse,
                                        const warpattn_tensor* dq, const warpattn_tensor* dk,
                                        const warpattn_tensor* dv, const warpattn_tensor* dsinks,
                                        const warpattn_forward_options* options, int deterministic, void* workspace,
                                        size_t workspace_bytes, void* stream, char* err, size_t err_len);

/* Stores in *bytes the workspace warpattn_backward_ex needs for q (B, Sq, Hq, D) and these
 * options. Returns as warpattn_backward_workspace_bytes. */
WARPATTN_C_API int warpattn_backward_ex_workspace_bytes(const warpattn_tensor* q,
                                                        const warpattn_forward_options* options, int deterministic,
                                                        size_t* bytes, char* err, size_t err_len);

/* Stores in *bytes the workspace warpattn_backward needs for q (B, Sq, Hq, D) and these options.
 * Only q's rank and sizes are checked (rank 4, sizes >= 0; q's dtype code must still be one of
 * WARPATTN_DTYPE_*). Returns WARPATTN_OK, or WARPATTN_INVALID / WARPATTN_INTERNAL_ERROR with err
 * set and *bytes untouched. Never throws; touches no GPU. */
WARPATTN_C_API int warpattn_backward_workspace_bytes(const warpattn_tensor* q, int causal,
                                                     int deterministic, size_t* bytes, char* err,
                                                     size_t err_len);

/* warpattn_forward on a packed variable-length batch (warpattn::forward_varlen):
 *   q, out (total_q, Hq, D); k, v (total_k, Hkv, D); lse NULL or (Hq, total_q) fp32;
 *   cu_seqlens_q, cu_seqlens_k: (B + 1) int32 device arrays (WARPATTN_DTYPE_S32), contiguous;
 *   seqused_k: NULL or (B) int32; max_seqlen_q, max_seqlen_k: >= 0 (not needed by warpattn).
 * The offsets are read on the device only. Other arguments and the return value as
 * warpattn_forward. */
WARPATTN_C_API int warpattn_forward_varlen(const warpattn_tensor* q, const warpattn_tensor* k,
                                           const warpattn_tensor* v, const warpattn_tensor* out,
                                           const warpattn_tensor* lse, const warpattn_tensor* cu_seqlens_q,
                                           const warpattn_tensor* cu_seqlens_k, const warpattn_tensor* seqused_k,
                                           int64_t max_seqlen_q, int64_t max_seqlen_k, int has_scale,
                                           float softmax_scale, int causal, void* stream, char* err,
                                           size_t err_len);

/* warpattn_backward on a packed variable-length batch (warpattn::backward_varlen): tensors as
 * warpattn_forward_varlen takes them (dout, dq like q; dk, dv like k; lse (Hq, total_q)), the
 * offsets as there, the other arguments as warpattn_backward (the workspace from
 * warpattn_backward_varlen_workspace_bytes). */
WARPATTN_C_API int warpattn_backward_varlen(
    const warpattn_tensor* dout, const warpattn_tensor* q, const warpattn_tensor* k, const warpattn_tensor* v,
    const warpattn_tensor* out, const warpattn_tensor* lse, const warpattn_tensor* dq, const warpattn_tensor* dk,
    const warpattn_tensor* dv, const warpattn_tensor* cu_seqlens_q, const warpattn_tensor* cu_seqlens_k,
    const warpattn_tensor* seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, int has_scale, float softmax_scale,
    int causal, int deterministic, void* workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len);

/* The workspace warpattn_backward_varlen needs for q (total_q, Hq, D) and `batch` sequences. As
 * warpattn_backward_workspace_bytes otherwise. */
WARPATTN_C_API int warpattn_backward_varlen_workspace_bytes(const warpattn_tensor* q, int64_t batch, int causal,
                                                            int deterministic, size_t* bytes, char* err,
                                                            size_t err_len);

/* sizeof(warpattn_tensor) as this library was compiled: an FFI mirror must match it. */
WARPATTN_C_API size_t warpattn_tensor_struct_size(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WARPATTN_WARPATTN_C_H */
