// The body of each forward_<dtype>_d<dim>.cu: one dtype and head dim, banded (causal or a
// sliding window: ForwardProblem::banded, the kernels' kCausal) and not (for FP8,
// both output dtypes; forward_fp8_int8qk_d<dim>.cu for INT8 Q and K), and where the head dim
// has them the tall tiles for long sequences. One file per pair so that builds spread over
// cores.
#pragma once
#include "hopper/run_forward.cuh"
#include "hopper/tile_shapes.hpp"

namespace warpattn::detail {

// Whether a sliding window is narrow enough that the tall tiles lose: a block of rows computes
// its rows plus the window's keys, so a 192-row block against a 256-key window computes 448
// keys a row for 256 useful (57%), a 128-row block 384 (67%). Run 140: d = 64, window 256 at
// 0.80 of cuDNN's own sliding window on the tall tiles, 1.00 at 1024 and 1.15 at 4096. The
// choice follows the call's options alone (the batch-invariant mode keeps it).
inline constexpr int kTallTileMinBand = 1024;
inline bool narrow_band(const KeyBand& band) {
  if (band.left == kUnbounded || band.right == kUnbounded) return false;
  return static_cast<long long>(band.left) + band.right + 1 < kTallTileMinBand;
}

// Runs Cfg, or TallCfg (a head dim with tall tiles) from kTallTileMinRows query rows on (16-bit:
// not on a narrow window).
template <class Cfg, class TallCfg, bool kTall>
void run_forward_tiles(const ForwardProblem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream,
                       const Fp8Operands* fp8 = nullptr) {
  if constexpr (kTall)
    if (p.seqlen_q >= kTallTileMinRows && (Cfg::kFp8 || !narrow_band(p.band)))
      return run_forward<TallCfg>(p, q, k, v, out, lse, stream, fp8);
  run_forward<Cfg>(p, q, k, v, out, lse, stream, fp8);
}

template <class Element, int kHeadDim, bool kCausal>
void run_forward_causal(const ForwardProblem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {
  if constexpr (kCausal && kHasNarrowTiles<kHeadDim>)
    if (narrow_band(p.band)) return run_forward<NarrowForwardConfigFor<Element, kHeadDim>>(p, q, k, v, out, lse, stream);
  run_forward_tiles<ForwardConfigFor<Element, kHeadDim, kCausal>, TallForwardConfigFor<Element, kHeadDim, kCausal>,
                    kHasTallTiles<kHeadDim>>(p, q, k, v, out, lse, stream);
}

template <int kHeadDim, bool kCausal, class Out, class QKElement>
void run_fp8_causal(const ForwardProblem& p, const Fp8Operands& f, const TensorView& out,
                    const std::optional<TensorView>& lse, cudaStream_t stream) {
  run_forward_tiles<Fp8ForwardConfigFor<kHeadDim, kCausal, Out, QKElement>,
                    Fp8ForwardConfigFor<kHeadDim, kCausal, Out, QKElement, 3>, kHasTallTiles<kHeadDim>>(
      p, f.q, f.k, f.vt, out, lse, stream, &f);
}

// Packed 16-bit batches at d = 64 take the tall tiles whatever their lengths (but not on a
// narrow window, as the dense launch). Run 106: with the
// normal tiles only, d = 64 reached 0.82-0.90 of the dense kernel on the issue's mixes; run 139
// (bench_varlen, 3 passes): where the longest sequence is short (the `short` mix, all below
// 2048 rows) the tall tiles took 0.85x the normal tiles' time without a mask and 1.00x causal,
// and on the other mixes the two choices were the same kernel. So the batch-invariant mode, whose
// choice must not follow the batch's longest sequence (112-key tiles give other bits than the
// normal tiles' 128), costs nothing here. FP8 batches keep FlashAttention's max_seqlen_q hint (a
// wrong one costs speed, not correctness): their tall tiles are not timed on short batches.
inline bool packed_fp8_takes_tall_tiles(const ForwardProblem& p, const VarlenSequences& seqs) {
  return p.batch_invariant || seqs.max_seqlen_q >= kTallTileMinRows;
}
template <class Element, int kHeadDim, bool kCausal>
void run_forward_varlen_causal(const ForwardProblem& p, const VarlenSequences& seqs, const TensorView& q,
                               const TensorView& k, const TensorView& v, const TensorView& out,
                               const std::optional<TensorView>& lse, cudaStream_t stream) {
  if constexpr (kHasTallTiles<kHeadDim>)
    if (!narrow_band(p.band))
      return run_forward_varlen<VarlenConfig<TallForwardConfigFor<Element, kHeadDim, kCausal>>>(p, seqs, q, k, v, out,
                                                                                               lse, stream);
  if constexpr (kCausal && kHasNarrowTiles<kHeadDim>)
    if (narrow_band(p.band))
      return run_forward_varlen<VarlenConfig<NarrowForwardConfigFor<Element, kHeadDim>>>(p, seqs, q, k, v, out, lse,
                                                                                        stream);
  run_forward_varlen<VarlenConfig<ForwardConfigFor<Element, kHeadDim, kCausal>>>(p, seqs, q, k, v, out, lse, stream);
}

template <int kHeadDim, bool kCausal, class Out, class QKElement>
void run_fp8_varlen_causal(const ForwardProblem& p, const VarlenSequences& seqs, const Fp8Operands& f,
                           const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {
  if constexpr (kHasTallTiles<kHeadDim>)
    if (packed_fp8_takes_tall_tiles(p, seqs))
      return run_forward_varlen<VarlenConfig<Fp8ForwardConfigFor<kHeadDim, kCausal, Out, QKElement, 3>>>(
          p, seqs, f.q, f.k, f.vt, out, lse, stream, &f);
  run_forward_varlen<VarlenConfig<Fp8ForwardConfigFor<kHeadDim, kCausal, Out, QKElement>>>(p, seqs, f.q, f.k, f.vt, out,
                                                                                          lse, stream, &f);
}

}  // namespace warpattn::detail

// The dense forward of one dtype and head dim (alone for 512: packed batches, KV caches and FP8
// stop at 256).
#define WARPATTN_FORWARD_DENSE_INSTANCE(Element, kHeadDim)                                        \
  namespace warpattn::detail {                                                                    \
  template <>                                                                                     \
  void run_forward_head_dim<Element, kHeadDim>(                                                   \
      const ForwardProblem& p, const TensorView& q, const TensorView& k, const TensorView& v,     \
      const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {         \
    if (p.banded)                                                                                 \
      run_forward_causal<Element, kHeadDim, true>(p, q, k, v, out, lse, stream);                  \
    else                                                                                          \
      run_forward_causal<Element, kHeadDim, false>(p, q, k, v, out, lse, stream);                 \
  }                                                                                               \
  }

// The dense forward and the packed batches' of one dtype and head dim.
#define WARPATTN_FORWARD_INSTANCE(Element, kHeadDim)                                              \
  WARPATTN_FORWARD_DENSE_INSTANCE(Element, kHeadDim)                                              \
  namespace warpattn::detail {                                                                    \
  template <>                                                                                     \
  void run_forward_varlen_head_dim<Element, kHeadDim>(                                            \
      const ForwardProblem& p, const VarlenSequences& seqs, const TensorView& q, const TensorView& k, \
      const TensorView& v, const TensorView& out, const std::optional<TensorView>& lse,           \
      cudaStream_t stream) {                                                                      \
    if (p.banded)                                                                                 \
      run_forward_varlen_causal<Element, kHeadDim, true>(p, seqs, q, k, v, out, lse, stream);     \
    else                                                                                          \
      run_forward_varlen_causal<Element, kHeadDim, false>(p, seqs, q, k, v, out, lse, stream);    \
  }                                                                                               \
  }

// QKElement: __nv_fp8_e4m3, or int8_t for INT8 Q and K.
#define WARPATTN_FORWARD_FP8_INSTANCE(kHeadDim, QKElement)                                            \
  namespace warpattn::detail {                                                                      \
  template <class Out>                                                                              \
  static void run_fp8_out(const ForwardProblem& p, const Fp8Operands& f, const TensorView& out,     \
                          const std::optional<TensorView>& lse, cudaStream_t stream) {              \
    if (p.banded)                                                                                   \
      run_fp8_causal<kHeadDim, true, Out, QKElement>(p, f, out, lse, stream);                       \
    else                                                                                            \
      run_fp8_causal<kHeadDim, false, Out, QKElement>(p, f, out, lse, stream);                      \
  }                                                                                                 \
  template <class Out>                                                                              \
  static void run_fp8_varlen_out(const ForwardProblem& p, const VarlenSequences& seqs,              \
                                 const Fp8Operands& f, const TensorView& out,                       \
                                 const std::optional<TensorView>& lse, cudaStream_t stream) {       \
    if (p.banded)                                                                                   \
      run_fp8_varlen_causal<kHeadDim, true, Out, QKElement>(p, seqs, f, out, lse, stream);          \
    else                                                                                            \
      run_fp8_varlen_causal<kHeadDim, false, Out, QKElement>(p, seqs, f, out, lse, stream);         \
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
  template <>                                                                                       \
  void run_forward_fp8_varlen_head_dim<kHeadDim, QKElement>(                                        \
      const ForwardProblem& p, const VarlenSequences& seqs, const Fp8Operands& f,                   \
      const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream) {           \
    if (p.dtype == DType::bf16)                                                                     \
      run_fp8_varlen_out<__nv_bfloat16>(p, seqs, f, out, lse, stream);                              \
    else                                                                                            \
      run_fp8_varlen_out<__half>(p, seqs, f, out, lse, stream);                                     \
  }                                                                                                 \
  }
