// What validation hands to dispatch: the checked sizes of one call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hopper/decode/decode_plan.hpp"
#include "hopper/decode/kv_pages.hpp"
#include "hopper/varlen/varlen_tiles.hpp"
#include "warpattn/fp8.hpp"
#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

// The checked sizes of a call (forward, backward, quantize_fp8, forward_fp8).
struct ProblemSizes {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  // v's (and out's) head dim where it differs from q and k's (MLA's 192/128, say); 0: the same.
  int64_t head_dim_v = 0;
  int64_t value_head_dim() const { return head_dim_v != 0 ? head_dim_v : head_dim; }
  // The compiled head dim that runs the call (64, 128, 256, or 512 for the dense forward): the
  // next up from q's (validation keeps v's within it, so that a workspace sized from q alone
  // fits, and the other calls below 512).
  int kernel_dim() const { return forward_kernel_head_dim(head_dim); }
};

struct ForwardProblem : ProblemSizes {
  DType dtype = DType::bf16;
  float softmax_scale = 1.f;  // resolved: the option, or 1/sqrt(head_dim)
  bool causal = false;
  bool has_lse = false;
  bool batch_invariant = false;  // no split tail; packed batches: tile shapes not from the longest sequence
  // The keys each row sees (causal and window_size resolved, kUnbounded for an open side), and
  // whether that is a band at all: then the banded kernels (Cfg::kCausal) run.
  KeyBand band;
  bool banded = false;
  float softcap = 0;           // > 0: on
  const float* sinks = nullptr;  // per query head, or null
  int64_t sinks_stride = 1;
};

// Checks every rule of the API (see warpattn.hpp) on the host, without touching the GPU.
// Throws Error naming the argument, what was expected and what came.
ForwardProblem validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const std::optional<TensorView>& lse,
                                const ForwardOptions& options);


// True when some dimension is 0 (nothing to read or write).
bool is_empty(const TensorView& t);

// Every rule of Fp8Operands (shapes, dtypes, TMA layout of q, k, vt; descale shapes).
ProblemSizes validate_fp8_operands(const Fp8Operands& f);

// quantize_fp8: q, k, v as forward() takes them, matching `f` in sizes and not overlapping it.
ProblemSizes validate_quantize(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& f);

// forward_fp8: the operands, then out and lse as forward() takes them (out fp16 or bf16);
// the problem's dtype is out's.
ForwardProblem validate_forward_fp8(const Fp8Operands& f, const TensorView& out, const std::optional<TensorView>& lse,
                                    const ForwardOptions& options);

// A validated call on a packed batch: the problem (batch: the number of sequences; seqlen_q
// and seqlen_k: the packed lengths), the tensors as (1, total, heads, head_dim) views (lse
// (1, heads, total_q)) and the device offsets.
struct VarlenCall {
  ForwardProblem problem;
  TensorView q, k, v, out;
  std::optional<TensorView> lse;
  VarlenSequences seqs;
};

VarlenCall validate_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const std::optional<TensorView>& lse,
                                   const VarlenBatch& batch, const ForwardOptions& options);

// A validated call over KV caches: the problem (batch B, seqlen_q Sq, seqlen_k the capacity of
// a sequence's cache), its sequences' lengths (decode_plan.hpp's KvCacheWork: the launch sets
// the split count) and where its keys are (the launch sets the box sizes); appended: the new rows
// per sequence (0: none).
struct KvCacheCall {
  ForwardProblem problem;
  KvCacheWork work;
  KvPages pages;
  int64_t appended = 0;
  int num_splits = 0;  // KvCache::num_splits
  bool fp8 = false;    // an E4M3 cache (KvCache::k_descale): p.dtype is q's and out's
};
KvCacheCall validate_forward_kvcache(const TensorView& q, const KvCache& cache, const TensorView& out,
                                     const std::optional<TensorView>& lse, const ForwardOptions& options);

// A validated FP8 call on a packed batch: the operands (and q, k, v of quantize_fp8_varlen, out
// and lse of forward_fp8_varlen) as (1, ...) views, the problem (batch: the sequences) and the
// device offsets.
struct VarlenFp8Call {
  Fp8Operands f;
  TensorView q, k, v, out;
  std::optional<TensorView> lse;
  ForwardProblem problem;
  VarlenSequences seqs;
};
VarlenFp8Call validate_quantize_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const Fp8Operands& f, const VarlenBatch& batch);
VarlenFp8Call validate_forward_fp8_varlen(const Fp8Operands& f, const TensorView& out,
                                          const std::optional<TensorView>& lse, const VarlenBatch& batch,
                                          const ForwardOptions& options);

// What validation hands to the backward's dispatch.
struct BackwardProblem : ProblemSizes {
  DType dtype = DType::bf16;
  float softmax_scale = 1.f;  // resolved
  bool causal = false;
  bool deterministic = false;
  bool varlen = false;  // a packed batch: batch sequences, seqlen_q/k the packed lengths
  KeyBand band;         // as ForwardProblem's
  bool banded = false;
  float softcap = 0;
  // Sinks and their gradient (both or neither).
  const float* sinks = nullptr;
  int64_t sinks_stride = 1;
  float* dsinks = nullptr;
  int64_t dsinks_stride = 1;
  // The compiled head dim that runs the backward: kernel_dim(), except that a softcap at head
  // dims 64 or less runs in the 128 kernel (its columns past head_dim zero-filled, as for 72 to
  // 120): the 64 kernel has no softcap (the tanh's derivative spilled its registers there).
  int backward_kernel_dim() const { return softcap != 0.f && kernel_dim() == 64 ? 128 : kernel_dim(); }
};

// The tensors of one backward call, validated.
struct BackwardTensors {
  TensorView dout, q, k, v, out, lse, dq, dk, dv;
};

// Every rule of backward() (see warpattn.hpp): the tensors' (the forward's rules, a to m, over
// nine tensors), then the workspace's (n: the size the problem needs, within 2^62 bytes; a
// given workspace's pointer, size and overlap). Throws Error as validate_forward.
BackwardProblem validate_backward(const BackwardTensors& t, const BackwardOptions& options,
                                  const std::optional<Workspace>& workspace);

// A validated backward call on a packed batch: the tensors as (1, total, heads, head_dim) views
// (lse (1, heads, total_q)), the problem (varlen: batch sequences, seqlen_q/k the packed lengths)
// and the device offsets.
struct VarlenBackwardCall {
  BackwardTensors t;
  BackwardProblem problem;
  VarlenSequences seqs;
};
VarlenBackwardCall validate_backward_varlen(const BackwardTensors& t, const VarlenBatch& batch,
                                            const BackwardOptions& options, const std::optional<Workspace>& workspace);

// warpattn::backward_varlen_workspace_bytes: q's rank (3) and sizes checked, batch >= 0.
size_t backward_varlen_workspace_bytes(const TensorView& q, int64_t batch, const BackwardOptions& options);

// warpattn::backward_workspace_bytes: q's rank and sizes checked (rules a and b), then the
// Hopper layout's size (hopper/backward/workspace.hpp) for that q.
size_t backward_workspace_bytes(const TensorView& q, const BackwardOptions& options);

}  // namespace warpattn::detail
