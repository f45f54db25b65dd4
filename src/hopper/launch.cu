// Dispatch: dtype x head dim -> one instantiation (causal is chosen inside it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "hopper/head_dim_dispatch.hpp"
#include "hopper/launch.hpp"
#include "hopper/decode/run_kvcache.cuh"
#include "hopper/run_forward.cuh"

namespace warpattn::detail {

void launch_forward_sm90(const ForwardProblem& p, const TensorView& q, const TensorView& k,
                         const TensorView& v, const TensorView& out,
                         const std::optional<TensorView>& lse, cudaStream_t stream) {
  with_16bit_element(p.dtype, [&](auto element) {
    with_forward_head_dim(p.head_dim, p.value_head_dim(), [&](auto d) {
      run_forward_head_dim<decltype(element), decltype(d)::value>(p, q, k, v, out, lse, stream);
    });
  });
}

void launch_forward_varlen_sm90(const ForwardProblem& p, const VarlenSequences& seqs, const TensorView& q,
                                const TensorView& k, const TensorView& v, const TensorView& out,
                                const std::optional<TensorView>& lse, cudaStream_t stream) {
  with_16bit_element(p.dtype, [&](auto element) {
    with_forward_head_dim(p.head_dim, p.value_head_dim(), [&](auto d) {
      run_forward_varlen_head_dim<decltype(element), decltype(d)::value>(p, seqs, q, k, v, out, lse, stream);
    });
  });
}

void launch_forward_kvcache_sm90(const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages,
                                 int num_splits, const NewRows* append, const TensorView& q,
                                 const TensorView& k_cache, const TensorView& v_cache, const TensorView& out,
                                 const std::optional<TensorView>& lse, cudaStream_t stream) {
  with_16bit_element(p.dtype, [&](auto element) {
    with_kvcache_head_dim(p.kernel_dim(), [&](auto d) {
      run_forward_kvcache_head_dim<decltype(element), decltype(d)::value>(p, work, pages, num_splits, append, q,
                                                                          k_cache, v_cache, out, lse, stream);
    });
  });
}

void launch_forward_kvcache_fp8_sm90(const ForwardProblem& p, const KvCacheWork& work, const KvPages& pages,
                                     int num_splits, const NewRows* append, const TensorView& q,
                                     const TensorView& k_cache, const TensorView& v_cache,
                                     const CacheDescales& descales, const TensorView& out,
                                     const std::optional<TensorView>& lse, cudaStream_t stream) {
  // (validation takes head dims 64, 128 and 256: kFp8CacheHeadDims)
  if (p.head_dim == 64)
    run_forward_kvcache_fp8_head_dim<64>(p, work, pages, num_splits, append, q, k_cache, v_cache, descales, out, lse,
                                         stream);
  else if (p.head_dim == 128)
    run_forward_kvcache_fp8_head_dim<128>(p, work, pages, num_splits, append, q, k_cache, v_cache, descales, out, lse,
                                          stream);
  else
    run_forward_kvcache_fp8_head_dim<256>(p, work, pages, num_splits, append, q, k_cache, v_cache, descales, out, lse,
                                          stream);
}

void launch_forward_fp8_varlen_sm90(const ForwardProblem& p, const VarlenSequences& seqs, const Fp8Operands& fp8,
                                    const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {
  with_head_dim(p.kernel_dim(), "FP8 kernel", [&](auto d) {
    if (fp8.q.dtype == DType::s8)
      run_forward_fp8_varlen_head_dim<decltype(d)::value, int8_t>(p, seqs, fp8, out, lse, stream);
    else
      run_forward_fp8_varlen_head_dim<decltype(d)::value, __nv_fp8_e4m3>(p, seqs, fp8, out, lse, stream);
  });
}

void launch_forward_fp8_sm90(const ForwardProblem& p, const Fp8Operands& fp8, const TensorView& out,
                             const std::optional<TensorView>& lse, cudaStream_t stream) {
  with_head_dim(p.kernel_dim(), "FP8 kernel", [&](auto d) {
    if (fp8.q.dtype == DType::s8)
      run_forward_fp8_head_dim<decltype(d)::value, int8_t>(p, fp8, out, lse, stream);
    else
      run_forward_fp8_head_dim<decltype(d)::value, __nv_fp8_e4m3>(p, fp8, out, lse, stream);
  });
}

}  // namespace warpattn::detail
