// The body of each forward_<dtype>_d<dim>.cu: one dtype and head dim, causal and not (for FP8,
// both output dtypes; forward_fp8_int8qk_d<dim>.cu for INT8 Q and K). One file per pair so that builds spread over cores.
#pragma once
#include "hopper/run_forward.cuh"
#include "hopper/tile_shapes.hpp"

#define WARPATTN_FORWARD_INSTANCE(Element, kHeadDim)                                              \
  namespace warpattn::detail {                                                                    \
  template <>                                                                                     \
  void run_forward_head_dim<Element, kHeadDim>(                                                   \
      const ForwardProblem& p, const TensorView& q, const TensorView& k, const TensorView& v,     \
      const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {         \
    if (p.causal)                                                                                 \
      run_forward<ForwardConfigFor<Element, kHeadDim, true>>(p, q, k, v, out, lse, stream);       \
    else                                                                                          \
      run_forward<ForwardConfigFor<Element, kHeadDim, false>>(p, q, k, v, out, lse, stream);      \
  }                                                                                               \
  }

// QKElement: __nv_fp8_e4m3, or int8_t for INT8 Q and K.
#define WARPATTN_FORWARD_FP8_INSTANCE(kHeadDim, QKElement)                                            \
  namespace warpattn::detail {                                                                      \
  template <class Out>                                                                              \
  static void run_fp8_out(const ForwardProblem& p, const Fp8Operands& f, const TensorView& out,     \
                          const std::optional<TensorView>& lse, cudaStream_t stream) {              \
    if (p.causal)                                                                                   \
      run_forward<Fp8ForwardConfigFor<kHeadDim, true, Out, QKElement>>(p, f.q, f.k, f.vt, out, lse, stream, &f);  \
    else                                                                                            \
      run_forward<Fp8ForwardConfigFor<kHeadDim, false, Out, QKElement>>(p, f.q, f.k, f.vt, out, lse, stream, &f); \
  }                                                                                                 \
  template <>                                                                                       \
  void run_forward_fp8_head_dim<kHeadDim, QKElement>(const ForwardProblem& p, const Fp8Operands& f, \
                                                     const TensorView& out,                         \
                                                     const std::optional<TensorView>& lse,          \
                                                     cudaStream_t stream) {                         \
    if (p.dtype == DType::bf16)                                                                     \
      run_fp8_out<__nv_bfloat16>(p, f, out, lse, stream);                                           \
    else                                                                                            \
      run_fp8_out<__half>(p, f, out, lse, stream);                                                  \
  }                                                                                                 \
  }
