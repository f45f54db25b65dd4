// The host side of the Hopper forward kernel: tensor maps, launch configuration, launch.
#pragma once

#include <optional>

#include "api/problem.hpp"
#include "hopper/decode/append_kv.hpp"
#include "hopper/decode/decode_plan.hpp"
#include "hopper/decode/kv_pages.hpp"
#include "hopper/varlen/varlen_tiles.hpp"

namespace warpattn::detail {

// Runs the forward kernel for a validated problem with batch, seqlen_q and seqlen_k >= 1.
void launch_forward_sm90(const ForwardProblem& p, const TensorView& q, const TensorView& k,
                         const TensorView& v, const TensorView& out,
                         const std::optional<TensorView>& lse, cudaStream_t stream);

// A packed variable-length batch: q, k, v, out as (1, total, heads, head_dim) views, lse as
// (1, heads, total_q); p.batch sequences (>= 1), p.seqlen_q/k the packed lengths (total_q >= 1,
// total_k >= 1).
void launch_forward_varlen_sm90(const ForwardProblem& p, const VarlenSequences& seqs, const TensorView& q,
                                const TensorView& k, const TensorView& v, const TensorView& out,
                                const std::optional<TensorView>& lse, cudaStream_t stream);

// Over KV caches (validate_forward_kvcache): q, out (B, Sq, Hq, D), lse (B, Hq, Sq), the caches
// dense or paged (pages); p.batch, p.seqlen_q >= 1 and p.seqlen_k, the capacity, >= 1. The new
// rows, if given (append), are written into the caches before the attention, once nothing else
// can fail. num_splits: the pieces of each tile's keys (0: chosen here).
void launch_forward_kvcache_sm90(const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages,
                                 int num_splits, const NewRows* append, const TensorView& q,
                                 const TensorView& k_cache, const TensorView& v_cache, const TensorView& out,
                                 const std::optional<TensorView>& lse, cudaStream_t stream);

// The same over an E4M3 cache (KvCache::k_descale; run_kvcache.cuh's layouts): q, out and the
// new rows 16-bit (p.dtype), head dim 64, 128 or 256.
void launch_forward_kvcache_fp8_sm90(const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages,
                                     int num_splits, const NewRows* append, const TensorView& q,
                                     const TensorView& k_cache, const TensorView& v_cache,
                                     const CacheDescales& descales, const TensorView& out,
                                     const std::optional<TensorView>& lse, cudaStream_t stream);

// FP8: p.dtype is the output's; seqlen_k >= 1.
void launch_forward_fp8_sm90(const ForwardProblem& p, const Fp8Operands& fp8, const TensorView& out,
                             const std::optional<TensorView>& lse, cudaStream_t stream);

// FP8 on a packed batch: fp8's tensors as (1, ...) views (validate_forward_fp8_varlen), out
// (1, total_q, heads, head_dim), lse (1, heads, total_q); total_k >= 1.
void launch_forward_fp8_varlen_sm90(const ForwardProblem& p, const VarlenSequences& seqs, const Fp8Operands& fp8,
                                    const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream);

// seqlen_k == 0 (and seqlen_q >= 1): every query row has no key, so out is zero and lse -inf.
void fill_no_key_rows(const ForwardProblem& p, const TensorView& out,
                      const std::optional<TensorView>& lse, cudaStream_t stream);

// Writes +0 to every element of a (B, S, H, D) 16-bit tensor (the backward's dK and dV when
// there is no query row).
void zero_rows(const TensorView& t, cudaStream_t stream);

// Writes +0 to n fp32 values `stride` apart (the backward's dsinks when there is no row).
void zero_floats(float* data, int64_t n, int64_t stride, cudaStream_t stream);

}  // namespace warpattn::detail
