// warpattn: exact attention for NVIDIA Hopper (sm_90a).
//
// The public C++ API. Tensors are described by views (pointer, dtype, shape, strides) in
// FlashAttention's (batch, seqlen, heads, head_dim) layout; nothing is copied or owned.
//
//   warpattn::forward(q, k, v, out, lse, options, stream);
//
// Every invalid call throws warpattn::Error before any kernel is launched and before anything
// is written; the message names the argument, what was expected and what came.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

namespace warpattn {

// e4m3: FP8 E4M3 ("float8_e4m3fn"), the operand type of forward_fp8 (warpattn/fp8.hpp).
// e4m3 and s8 are operand types of forward_fp8 only (warpattn/fp8.hpp); s32 is the type of the
// sequence offsets of packed batches (VarlenBatch).
enum class DType : int { f16 = 0, bf16 = 1, f32 = 2, e4m3 = 3, s8 = 4, s32 = 5 };

// Bytes per element of a dtype.
constexpr int dtype_size(DType t) {
  return t == DType::f32 || t == DType::s32 ? 4 : (t == DType::e4m3 || t == DType::s8 ? 1 : 2);
}
const char* dtype_name(DType t);

// A strided view of device memory. Strides are in elements, not bytes.
// Attention tensors have rank 4: (batch, seqlen, heads, head_dim).
// The log-sum-exp tensor has rank 3: (batch, heads, seqlen_q), fp32.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::bf16;
  int rank = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
};

// A contiguous (row-major) view of `shape`.
TensorView make_contiguous_view(void* data, DType dtype, int rank, const int64_t* shape);

struct ForwardOptions {
  // Multiplies Q·Kᵀ before the softmax; finite and > 0. Default: 1/sqrt(head_dim).
  std::optional<float> softmax_scale;
  // Causal mask, aligned bottom-right when seqlen_q != seqlen_k (as FlashAttention 2 and 3):
  // query i sees key j iff j <= i + seqlen_k - seqlen_q.
  bool causal = false;
  // Batch-invariant: every row's result depends only on its own sequence (its lengths, heads,
  // head dim and dtype), never on the batch around it: the same bits alone or in any batch, at
  // any position. The default may split the last wave's key ranges over the SMs (a split that
  // depends on how many tiles the whole batch has) and, for packed batches, choose the tile
  // height from the longest sequence; this mode does neither. See the README's table of modes.
  bool batch_invariant = false;
  // Sliding window (local attention), FlashAttention's window_size = (left, right): query row i
  // sees key j iff diagonal - window_left <= j <= diagonal + window_right, where diagonal =
  // i + seqlen_k - seqlen_q (aligned bottom-right, as causal); -1 leaves that side unbounded.
  // With causal, window_right must be -1 or 0 (causal is right = 0). Key tiles wholly outside
  // the window are skipped: the work grows with seqlen x window, not seqlen².
  int window_left = -1, window_right = -1;
  // Softcap (Gemma 2): scores become softcap · tanh(softmax_scale · q·k / softcap) before the
  // mask and the softmax. 0: off; otherwise finite and > 0. The 16-bit forward only (not
  // forward_fp8).
  float softcap = 0;
  // Attention sinks (gpt-oss): an optional fp32 tensor of shape (heads_q,), one logit per query
  // head (natural log; neither scaled nor softcapped), device memory of the call's device. Each
  // joins its head's softmax denominator as a key without a value: a row's weights sum to less
  // than 1, lse includes the sink, and a row that sees no key gets out = 0 and lse = its sink.
  std::optional<TensorView> sinks;
};

// Thrown for every invalid argument (before any launch) and for CUDA failures.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Head dimensions every 16-bit kernel takes: every multiple of 8 from 8 to 256. The kernels are
// compiled for 64, 128 and 256; a head dim between runs in the next one up, its missing columns
// zero-filled by TMA on load and never written (kernel_head_dim). The dense forward and the
// backward go on to 512 (kForwardHeadDims, kBackwardHeadDims).
inline constexpr int kMinHeadDim = 8, kMaxHeadDim = 256, kHeadDimStep = 8;
inline constexpr auto kSupportedHeadDims = [] {
  std::array<int, kMaxHeadDim / kHeadDimStep> dims{};
  for (int i = 0; i < static_cast<int>(dims.size()); ++i) dims[i] = kMinHeadDim + i * kHeadDimStep;
  return dims;
}();
// The compiled head dim that serves head_dim (64, 128 or 256; 0 for a head dim not supported).
constexpr int kernel_head_dim(int64_t head_dim) {
  if (head_dim < kMinHeadDim || head_dim > kMaxHeadDim || head_dim % kHeadDimStep != 0) return 0;
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}
// The dense 16-bit forward (`forward`, flash_attn_func) also takes head dims above 256 up to
// 512, in a kernel compiled for 512 (its two consumer warpgroups each own half of the head dim;
// docs/headdim512-design.md), for packed batches and KV caches too, and so does the backward
// (dense and packed; its 512 kernel runs two CTAs per key block, one per half of the head dim).
// FP8 stops at 256.
inline constexpr int kMaxForwardHeadDim = 512;
inline constexpr auto kForwardHeadDims = [] {
  std::array<int, kMaxForwardHeadDim / kHeadDimStep> dims{};
  for (int i = 0; i < static_cast<int>(dims.size()); ++i) dims[i] = kMinHeadDim + i * kHeadDimStep;
  return dims;
}();
// The backward's head dims: the dense forward's (built, not yet run on the H200 at 264..512).
inline constexpr auto kBackwardHeadDims = kForwardHeadDims;
// The compiled head dim of the dense forward (and the backward) for head_dim: kernel_head_dim's,
// or 512 above 256.
constexpr int forward_kernel_head_dim(int64_t head_dim) {
  if (head_dim > kMaxHeadDim && head_dim <= kMaxForwardHeadDim && head_dim % kHeadDimStep == 0) return 512;
  return kernel_head_dim(head_dim);
}

// out = softmax(scale · q·kᵀ [+ causal mask]) · v, per batch and query head.
//   q:   (B, Sq, Hq, D)   fp16 or bf16; D a multiple of 8 up to 512 (kForwardHeadDims)
//   k,v: (B, Sk, Hkv, D)  same dtype as q; Hq must be a multiple of Hkv (GQA / MQA)
//   out: (B, Sq, Hq, D)   same dtype as q; must not overlap q, k, v or lse
//   lse: optional (B, Hq, Sq) fp32, natural log of the softmax denominator including the
//        scale; rows with no visible key get -inf (and their out rows are zero)
// Any batch/sequence/head strides, but the last dimension must be contiguous, every base must
// be 16-byte aligned and every other stride a multiple of 16 bytes (the TMA rules); out and lse
// must give each element its own address (taken in increasing order, each stride steps past
// what the smaller ones reach) and lse's strides must be positive.
// Every tensor must be device memory of one CUDA device, a Hopper GPU; the call runs there
// (it makes that device current for its launches and restores the caller's afterwards), on
// `stream`, which must belong to that device (0, cudaStreamLegacy and cudaStreamPerThread
// mean that device's). It returns without synchronising. Each launch of the persistent grid
// takes its scheduler memory (a tile counter, and for non-causal shapes whose last wave is
// split over all SMs room for partial results: 2 x SMs x 128 rows x (D + 8) x 4 bytes, about
// 36 MB at D = 256 on an H200) in stream order from a memory pool of warpattn's own, which
// keeps what it has grown to; launches that may run at the same time (other streams, other
// host threads on cudaStreamPerThread, CUDA graphs replayed at once) never share it. A launch
// captured into a CUDA graph gets scheduler memory of its own (cudaMalloc, zeroed by a node of
// the graph at each replay), kept for the process's life, since the graph may be replayed at
// any time.
void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const std::optional<TensorView>& lse, const ForwardOptions& options,
             cudaStream_t stream = nullptr);

// Checks every argument rule of forward() on the host, touching neither memory nor the GPU;
// throws the Error that forward() would throw. For bindings that need to report argument
// errors before they look at where the memory lives.
void validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const std::optional<TensorView>& lse,
                      const ForwardOptions& options);

struct BackwardOptions {
  // As ForwardOptions: the scale and mask of the forward call whose gradients are wanted.
  std::optional<float> softmax_scale;
  bool causal = false;
  // The same bits on every run: dQ's partial sums are added in a fixed order (dK and dV are
  // always deterministic). Slower; see docs/perf/ for by how much.
  bool deterministic = false;
  // Batch-invariant (as ForwardOptions'): implies deterministic, whose order of dQ's sums
  // depends only on each sequence's own lengths.
  bool batch_invariant = false;
  // The forward call's sliding window and softcap (as ForwardOptions').
  int window_left = -1, window_right = -1;
  float softcap = 0;
  // The forward call's sinks (its lse includes them), and their gradient: dsinks, an fp32
  // (heads_q,) tensor the call writes (required with sinks, refused without): dL/dsink_h =
  // -sum over the batch's rows i of head h of exp(sink_h - lse_i) · rowsum(dout_i ∘ out_i),
  // summed in a fixed order (the same bits every run).
  std::optional<TensorView> sinks, dsinks;
};

// Device memory the backward uses between its launches (dQ's fp32 accumulator, the row terms):
// `bytes` at least backward_workspace_bytes(...), 256-byte aligned, on the tensors' device, not
// used by anything else until the work enqueued by backward() on its stream has finished.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// Bytes of workspace backward() needs for q of shape (B, Sq, Hq, D) and these options
// (O(B x Hq x Sq x D) x 4 bytes). q's shape is validated (rank 4, sizes >= 0, a workspace below
// 2^62 bytes), nothing else.
size_t backward_workspace_bytes(const TensorView& q, const BackwardOptions& options);

// Gradients of forward(q, k, v) -> out with respect to q, k and v, given dout = dL/d(out):
//   dout, out, dq: (B, Sq, Hq, D)   same dtype as q (fp16 or bf16)
//   k, v, dk, dv:  (B, Sk, Hkv, D)  same dtype; Hq a multiple of Hkv (dk, dv summed over the
//                                   query heads of a group), and not 0 unless Hkv is
//   lse:           (B, Hq, Sq) fp32, the forward's log-sum-exp (natural log, -inf for rows
//                                   with no visible key)
// The layout rules of forward() apply to every tensor; dq, dk and dv must not overlap any
// other argument or each other, and give each element its own address. options must be those
// of the forward call. Accumulation is fp32.
// workspace: memory the call may use (see Workspace); without it the call takes it in stream
// order from warpattn's memory pool, which is refused while `stream` is being captured into a
// CUDA graph (a captured call must be given its workspace). Device and stream rules as
// forward(); returns without synchronising.
void backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const BackwardOptions& options,
              const std::optional<Workspace>& workspace = std::nullopt, cudaStream_t stream = nullptr);

// Every argument rule of backward() on the host, touching neither memory nor the GPU.
void validate_backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                       const TensorView& dv, const BackwardOptions& options,
                       const std::optional<Workspace>& workspace = std::nullopt);

// ---- Packed variable-length batches (FlashAttention's "varlen" layout).
// B sequences packed along one axis: sequence b's query rows are q[cu_seqlens_q[b] ..
// cu_seqlens_q[b + 1]), its keys k[cu_seqlens_k[b] .. cu_seqlens_k[b + 1]) (v likewise), and
// each attends only within itself (causal: aligned bottom-right per sequence). Zero-length
// sequences are allowed.
struct VarlenBatch {
  // (B + 1) int32 each, contiguous, device memory: 0 first, non-decreasing, the last entry at
  // most the packed length (total_q, total_k). These values are read on the device only (no
  // host synchronisation: CUDA graphs and torch.compile keep working), so they are not
  // validated: offsets that break these rules give wrong numbers for the sequences concerned,
  // never an access outside the tensors (every sequence is clamped to the packed length).
  TensorView cu_seqlens_q, cu_seqlens_k;
  // Optional (B) int32: sequence b uses only its first seqused_k[b] keys (a KV cache larger
  // than what is filled). The keys past it are still read: they must be finite.
  std::optional<TensorView> seqused_k;
  // The longest sequence's lengths, as FlashAttention takes them; warpattn plans the work on
  // the device and does not need them, but they must be >= 0 (checked).
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
};

// forward() on a packed batch:
//   q, out: (total_q, Hq, D); k, v: (total_k, Hkv, D); lse: optional (Hq, total_q) fp32.
// The dtype, head-dim, layout, overlap and device rules of forward() apply, and the offset
// arrays must not overlap out or lse. The rows of out and lse that no sequence covers are
// undefined after the call.
void forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const std::optional<TensorView>& lse, const VarlenBatch& batch, const ForwardOptions& options,
                    cudaStream_t stream = nullptr);

// Every argument rule of forward_varlen() on the host, touching neither memory nor the GPU.
void validate_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const std::optional<TensorView>& lse, const VarlenBatch& batch,
                             const ForwardOptions& options);

// Bytes of workspace backward_varlen() needs for q of shape (total_q, Hq, D), `batch` sequences
// and these options (O((total_q + G x batch) x Hq x D) x 4 bytes: each sequence's rows are
// padded to whole blocks of G rows, G = 128, or 320 where the kernel is the head-dim-128 one). Checks q's rank and sizes and batch >= 0, nothing else.
size_t backward_varlen_workspace_bytes(const TensorView& q, int64_t batch, const BackwardOptions& options);

// backward() on a packed batch: dout, out, dq like q (total_q, Hq, D); k, v, dk, dv
// (total_k, Hkv, D); lse (Hq, total_q), the forward_varlen's. The rules of backward() and of
// VarlenBatch apply; the workspace is backward_varlen_workspace_bytes() (the plan of the work,
// a few bytes per key block, comes from warpattn's stream-ordered pool, also under capture, where
// it is kept). Rows of dq, dk and dv that no sequence covers, and rows of dk and dv past a
// sequence's seqused_k, are either left as they were or set to zero (so gradients that start
// zeroed stay zero there).
void backward_varlen(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                     const TensorView& dv, const VarlenBatch& batch, const BackwardOptions& options,
                     const std::optional<Workspace>& workspace = std::nullopt, cudaStream_t stream = nullptr);

// Every argument rule of backward_varlen() on the host, touching neither memory nor the GPU.
void validate_backward_varlen(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& lse, const TensorView& dq,
                              const TensorView& dk, const TensorView& dv, const VarlenBatch& batch,
                              const BackwardOptions& options, const std::optional<Workspace>& workspace = std::nullopt);


// ---- KV caches (decode, FlashAttention's flash_attn_with_kvcache).
// Each of B sequences attends its Sq new query rows to the keys held in its cache, after the
// optional new keys and values have been appended to it. The cache is either
//   dense: k_cache, v_cache (B, S_cache, Hkv, D): sequence b's keys are k_cache[b, 0 .. len), or
//   paged: k_cache, v_cache (num_pages, page_size, Hkv, D) with block_table (B, max_pages)
//          int32: sequence b's key j is k_cache[block_table[b][j / page_size], j % page_size].
//          page_size is any size from 1 key (SGLang's 1, vLLM's 16, FlashAttention's 256, ...);
//          a key tile is loaded in boxes of the largest power of two dividing both the page
//          size and the tile, so pages of 16 keys and more, powers of two, load fastest.
// A sequence's capacity is S_cache (dense) or max_pages x page_size (paged).
struct KvCache {
  TensorView k_cache, v_cache;
  // Optional (B) int32: sequence b's cache holds cache_seqlens[b] keys before the append
  // (clamped to [0, capacity] on the device); absent: every cache is full (its capacity), and
  // nothing can be appended.
  std::optional<TensorView> cache_seqlens;
  // Optional (B, max_pages) int32, last dimension contiguous: the paged layout.
  std::optional<TensorView> block_table;
  // Optional new keys and values (B, S_new, Hkv, D), both or neither, dtype and head dims as
  // k_cache and v_cache: written into the cache at rows cache_seqlens[b] .. + S_new (through
  // the block table when paged) before the attention, which then sees
  // len = min(cache_seqlens[b] + S_new, capacity) keys (rows past the capacity are dropped).
  // cache_seqlens is only read: the caller advances it afterwards. Needs cache_seqlens.
  std::optional<TensorView> k, v;
  // How many pieces each work tile's keys are cut into over the SMs (flash-decoding), combined
  // afterwards through their log-sum-exps: 0 chooses from the shape and the SM count (1 in the
  // batch-invariant mode), 1 .. 128 asks for that many (fewer where their partial states would
  // pass 1 GiB: about 70 KB a piece at head dim 128).
  int num_splits = 0;
  // An E4M3 (FP8) cache, half the bytes a step reads (docs/decode-fp8-cache-design.md): k_cache
  // and v_cache float8_e4m3fn, with these (Hkv) fp32 descales, one per KV head (any stride >= 0;
  // 0: one for all heads, vLLM's per-layer k_scale and v_scale), fixed for the cache's life: a
  // cached element stands for its e4m3 value times its head's descale. Both or neither; given
  // exactly when the caches are e4m3. Layouts:
  //   k_cache: as a 16-bit cache's, one byte an element;
  //   v_cache: V transposed in slices of 16 keys, dense (B, Hkv, S_cache / 16, 16 D) or paged
  //            (num_pages, Hkv, page_size / 16, 16 D): v_cache[p, h, s, 16 c + j] holds column c
  //            of key 16 s + kFp8KeyOrder[j] of page p, head h (warpattn/fp8.hpp: forward_fp8's
  //            Vᵀ order), each slice's 16 D bytes contiguous (the tile layout the step's P·V
  //            GEMM reads, so a key tile streams in rows of 128 bytes);
  //   S_cache (dense) or page_size (paged) a multiple of 16; D 64, 128 or 256.
  // q, out and the new k and v stay fp16 or bf16: the new rows are quantised into the cache
  // (e4m3(x / descale), rounded to nearest even, saturated to +-448), and each step's q with one
  // descale per work tile (the query heads of one KV head at up to 128 / group positions: amax /
  // 448). No rotation (quantize_fp8's incoherent processing) in this first version, no softcap
  // (forward_fp8's rule). The descales are read on the device only: they must be finite and > 0,
  // and cache bytes inside a sequence's pages past its length must not be NaN codes (0x7F, 0xFF).
  std::optional<TensorView> k_descale, v_descale;
};

// forward() over each sequence's cache: out[b] = attention(q[b], keys 0 .. len of b's cache),
// causal (and a sliding window) aligned bottom-right, so new query row i sees keys up to
// len - Sq + i.
//   q, out: (B, Sq, Hq, D); lse: optional (B, Hq, Sq) fp32; options as forward()'s.
// The dtype, head-dim, GQA, layout, overlap and device rules of forward() apply to q, out,
// lse, the caches and the new keys and values; cache_seqlens and block_table must be device
// memory of the call's device that nothing written by the call overlaps. The lengths and the
// page indices are read on the device only (no host synchronisation: CUDA graphs keep
// working, with new lengths at every replay), so they are not validated there: a length is
// clamped to [0, capacity] (appended rows past the capacity are dropped), and a page index
// outside [0, num_pages) is never read (its keys count as keys of zeros: score 0, value 0)
// nor written. Cache rows past a sequence's length inside its pages are read: they must be
// finite.
// The kernel: forward_varlen()'s, on tiles it enumerates itself (no planning kernels before
// it), whose rows are the query heads of one KV head at each of a block of positions (GQA
// packing: K and V are read once per KV head), and whose key ranges are cut into pieces over
// the SMs when the tiles alone cannot fill them (KvCache::num_splits), combined afterwards in a
// fixed order.
void forward_kvcache(const TensorView& q, const KvCache& cache, const TensorView& out,
                     const std::optional<TensorView>& lse, const ForwardOptions& options,
                     cudaStream_t stream = nullptr);

// Every argument rule of forward_kvcache() on the host, touching neither memory nor the GPU.
void validate_forward_kvcache(const TensorView& q, const KvCache& cache, const TensorView& out,
                              const std::optional<TensorView>& lse, const ForwardOptions& options);

}  // namespace warpattn
