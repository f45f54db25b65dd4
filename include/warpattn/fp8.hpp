// warpattn FP8: attention with E4M3 operands (FlashAttention-3's second headline).
//
//   warpattn::quantize_fp8(q, k, v, fp8, options, stream);   // bf16/fp16 -> e4m3 + descales
//   warpattn::forward_fp8(fp8, out, lse, forward_options, stream);
//
// quantize_fp8 can rotate Q and K (incoherent processing: a random +-1 diagonal, then the
// normalised Walsh-Hadamard transform, the same on both, so q.k is unchanged in exact
// arithmetic) and scales per block of 128 rows (the kernel's tiles) or per tensor. A caller
// may also make the operands itself: Fp8Operands says exactly what forward_fp8 reads.
//
// Q and K may instead be INT8 (DType::s8; P and V stay e4m3), as SageAttention does: after the
// rotation a block of Q or K is close to Gaussian, and INT8's uniform step (amax / 127) then
// carries about 3x less error than E4M3's 3-bit mantissa (docs/perf/fp8-accuracy.md). Hopper's
// s8 wgmma runs at the FP8 rate and its int32 scores are exact; turning them into floats costs
// one integer add per score. Choose it by giving quantize_fp8 s8 tensors for q and k.
#pragma once

#include <cstdint>
#include <optional>

#include "warpattn/warpattn.hpp"

namespace warpattn {

// Rows of Q, and keys of K and V, that share one descale factor: the kernel's tile heights.
inline constexpr int kFp8BlockRows = 128;

// Head dimensions with an FP8 kernel.
inline constexpr int kFp8HeadDims[] = {64, 128, 256};

// Inside every group of 16 keys of Vᵀ, column 16g + s holds key 16g + kFp8KeyOrder[s]. This is
// the order in which the FP8 P·V GEMM meets P's values in registers (HOPPER-PRIMER.md §5.4):
// storing Vᵀ in it saves the kernel a shuffle of P.
inline constexpr int kFp8KeyOrder[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};

// Sk rounded up to a multiple of 16: the key count of Vᵀ's rows.
constexpr int64_t fp8_padded_keys(int64_t seqlen_k) { return (seqlen_k + 15) / 16 * 16; }

// The operands of forward_fp8 (dtype e4m3 for vt; e4m3 or s8 for q and k, the same for both;
// float32 for the descales):
//   q         (B, Sq, Hq, D)
//   k         (B, Sk, Hkv, D)
//   vt        (B, Hkv, D, fp8_padded_keys(Sk)): V transposed, keys in kFp8KeyOrder, zero past Sk
//   q_descale (B, Hq, ceil(Sq / 128));  k_descale, v_descale (B, Hkv, ceil(Sk / 128))
// The value an element stands for is its e4m3 (or integer) value times the descale of its block.
// q, k and vt follow the TMA rules of forward(); descales need only positive strides, except
// that forward_fp8 also takes a zero stride over the blocks: one descale per (batch, head), as
// FlashAttention-3's API takes them.
struct Fp8Operands {
  TensorView q, k, vt, q_descale, k_descale, v_descale;
};

enum class Fp8Scaling : int {
  per_block = 0,   // one descale per 128 rows (keys) per head: block amax / 448 (s8: / 127)
  per_tensor = 1,  // one descale for the whole tensor (every block gets the same value)
};

struct QuantizeOptions {
  bool rotate = true;  // incoherent processing of Q and K
  uint64_t seed = 0;   // seed of the random signs (the same signs on Q and K)
  Fp8Scaling scaling = Fp8Scaling::per_block;
};

// Writes `fp8` from q, k, v (fp16 or bf16, the layouts and rules of forward()); fp8.q and fp8.k
// e4m3, or both s8 for INT8 codes (rounded to nearest even, within +-127). One pass reads each
// input once under per-block scaling; per-tensor scaling reads Q and K twice (amax, then
// codes). Nothing is written if an argument is invalid. A NaN input gives NaN codes (e4m3), or
// for s8 a NaN descale for its block (per tensor: for the tensor), so it reaches the output.
// The written tensors (codes, Vᵀ, descales) must give each element its own address. Every
// tensor must be device memory of one Hopper GPU; the call runs there, as forward() does.
void quantize_fp8(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& fp8,
                  const QuantizeOptions& options, cudaStream_t stream = nullptr);

// out = softmax(scale · q·kᵀ [+ causal mask]) · v on the dequantised operands, out fp16 or bf16
// (B, Sq, Hq, D); lse as in forward(). With check_descales the descales are read back to the
// host and checked (finite and > 0) before the launch, so the call synchronises with `stream`
// once; pass false for operands known to be valid (quantize_fp8's) to keep it asynchronous.
// Device, stream and scheduler memory as in forward(): every tensor (the descales too) must be
// device memory of one Hopper GPU, and the call runs there.
void forward_fp8(const Fp8Operands& fp8, const TensorView& out, const std::optional<TensorView>& lse,
                 const ForwardOptions& options, cudaStream_t stream = nullptr, bool check_descales = true);

// ---- FP8 on a packed batch (VarlenBatch, warpattn.hpp). A descale block never spans two
// sequences: each sequence's rows start a 128-row block of a padded row space of
// fp8_varlen_rows(total, B) rows, sequence b's first padded row being
// (cu_seqlens[b] + 128 b) rounded down to a multiple of 128 (FlashAttention-3's padding). Operands:
//   q (total_q, Hq, D), k (total_k, Hkv, D): e4m3, or both s8, at the caller's packed rows
//   vt (Hkv, D, fp8_varlen_rows(total_k, B)): V transposed, sequence b's keys from its first
//      padded row, in kFp8KeyOrder per 16, zero elsewhere
//   q_descale (Hq, fp8_varlen_rows(total_q, B) / 128), k_descale, v_descale
//      (Hkv, fp8_varlen_rows(total_k, B) / 128): block j of sequence b at its first padded
//      row / 128 + j (the blocks between sequences are not read)
constexpr int64_t fp8_varlen_rows(int64_t total, int64_t batch) { return (total + batch * 128 + 127) / 128 * 128; }

// quantize_fp8 on a packed batch: q, k, v as forward_varlen() takes them, `fp8` as above, the
// same options; k's blocks follow cu_seqlens_k (seqused_k plays no part in quantisation).
void quantize_fp8_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& fp8,
                         const VarlenBatch& batch, const QuantizeOptions& options, cudaStream_t stream = nullptr);

// forward_fp8 on a packed batch: out (total_q, Hq, D) fp16 or bf16, lse (Hq, total_q), the
// offsets as forward_varlen() takes them.
void forward_fp8_varlen(const Fp8Operands& fp8, const TensorView& out, const std::optional<TensorView>& lse,
                        const VarlenBatch& batch, const ForwardOptions& options, cudaStream_t stream = nullptr,
                        bool check_descales = true);

void validate_quantize_fp8_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const Fp8Operands& fp8, const VarlenBatch& batch, const QuantizeOptions& options);
void validate_forward_fp8_varlen(const Fp8Operands& fp8, const TensorView& out, const std::optional<TensorView>& lse,
                                 const VarlenBatch& batch, const ForwardOptions& options);

// Check every argument rule of quantize_fp8 and forward_fp8 on the host, touching neither memory
// nor the GPU; throw the Error the call would throw. For bindings that report argument errors
// before they look at where the memory lives (the device checks come after these rules).
void validate_quantize_fp8(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& fp8,
                           const QuantizeOptions& options);
void validate_forward_fp8(const Fp8Operands& fp8, const TensorView& out, const std::optional<TensorView>& lse,
                          const ForwardOptions& options);

}  // namespace warpattn
