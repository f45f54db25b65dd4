// The two GEMMs of a consumer warpgroup, issued (not waited) as one wgmma group each. Each
// starts with wgmma.fence: the registers it reads were last written by ordinary instructions
// (softmax, rescale), and a fence in the same basic block keeps ptxas from injecting its own.
//   S = Q·Kᵀ : A = the warpgroup's 64 Q rows, B = a K tile, both K-major in smem (INT8 Q and
//              K: int32 scores, lifted to floats by lift_int_scores once waited for).
//   O += P·V : A = P from registers (the S accumulator converted in place), B = a V tile read
//              MN-major (tnspB = 1) straight from its TMA layout; for FP8, a Vᵀ tile read
//              K-major (FP8 wgmma has no transpose), its keys in kFp8KeyOrder.
#pragma once
#include <cstdint>

#include "hopper/ptx/math.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/ptx/wgmma_ops.cuh"

namespace warpattn::detail {

// K-major swizzled operand: 8-row groups 8 x the swizzle width apart; LBO unused (16 B by
// convention).
template <int kSwizzleBytes>
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t addr) {
  return ptx::make_smem_desc(addr, 16, 8 * kSwizzleBytes, kSwizzleBytes);
}

// Moves a descriptor's start address by a byte offset (a multiple of 16). Shared addresses
// stay below 2^18, so the 14-bit field never carries.
__device__ __forceinline__ uint64_t advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// acc (64 x kRows) = A·Bᵀ over the head dim: A = 64 rows at `a` of a tile with kARows rows per
// panel, B = kRows rows at `b` of a tile with kBRows rows per panel (by default the whole tile);
// both K-major in kW-byte swizzled panels (the TMA layout of Q, K, V and dO). The forward's
// S = Q·Kᵀ; the backward's Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (at d = 256 S = Q·Kᵀ and dP = dO·Vᵀ, B
// 40 of an 80-row K or V tile's rows: backward_consumer_n80.cuh).
template <class Element, int kPanels, int kARows, int kRows, int kW, int kBRows = kRows>
__device__ __forceinline__ void issue_rows_gemm(float (&acc)[kRows / 2], uint32_t a, uint32_t b) {
  using Mma = ptx::WgmmaSS<Element, kRows>;
  const uint64_t ad = kmajor_desc<kW>(a), bd = kmajor_desc<kW>(b);
  ptx::wgmma_fence();
#pragma unroll
  for (int p = 0; p < kPanels; ++p)
#pragma unroll
    for (int kk = 0; kk < kW / 32; ++kk)  // k steps (k16, or k32 for FP8) of 32 B in a panel row
      Mma::mma(acc, advance(ad, p * kARows * kW + kk * 32), advance(bd, p * kBRows * kW + kk * 32), p > 0 || kk > 0);
}

// acc (64 x kCols) += A·B, A in registers (kSteps k16 steps), B = kSteps·16 rows of a 16-bit tile
// read MN-major (kCols columns in 128-byte panels kPanelStride bytes apart). The forward's
// O += P·V; the backward's dV += Pᵀ·dO and dK += dSᵀ·Q.
// Its pieces, for a caller that issues the k16 steps one by one between other work (the
// backward's early dV): B's descriptor, and step kk.
template <int kPanelStride>
__device__ __forceinline__ uint64_t register_gemm_b_desc(uint32_t b) {
  return ptx::make_smem_desc(b, kPanelStride, 1024, 128);
}
template <class Element, int kCols>
__device__ __forceinline__ void issue_register_gemm_step(float (&acc)[kCols / 2], const uint32_t (&a)[4], uint64_t bd,
                                                         int kk) {
  ptx::WgmmaRS<Element, kCols>::mma(acc, a, advance(bd, kk * 16 * 128), 1);
}
template <class Element, int kCols, int kSteps, int kPanelStride>
__device__ __forceinline__ void issue_register_gemm(float (&acc)[kCols / 2], const uint32_t (&a)[kSteps][4],
                                                    uint32_t b) {
  const uint64_t bd = register_gemm_b_desc<kPanelStride>(b);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) issue_register_gemm_step<Element, kCols>(acc, a[kk], bd, kk);
}

// An m64nN f32 accumulator packed to 16 bits as the A operand of a k16 GEMM over its columns:
// for columns 16kk .. 16kk + 15 the registers acc[8kk .. 8kk + 7] already sit where the A
// fragment wants them. kRow (0 or 1) packs only that row's registers (register i of each step
// holds row i % 2); -1 packs both.
// k16 step kk of it alone (columns 16kk .. 16kk + 15).
template <class Element, int kRow = -1, int kRegs>
__device__ __forceinline__ void accumulator_step_to_operand(const float (&acc)[kRegs], int kk, uint32_t (&op)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (kRow < 0 || i % 2 == kRow) op[i] = ptx::pack_pair<Element>(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
}
template <class Element, int kCols, int kRow = -1>
__device__ __forceinline__ void accumulator_to_operand(const float (&acc)[kCols / 2], uint32_t (&op)[kCols / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kCols / 16; ++kk) accumulator_step_to_operand<Element, kRow>(acc, kk, op[kk]);
}

template <class Cfg>
__device__ __forceinline__ void issue_qk_gemm(float (&s)[Cfg::kBlockN / 2], uint32_t q_rows,
                                              uint32_t k_tile) {
  issue_rows_gemm<typename Cfg::QKElement, Cfg::kPanels, Cfg::kBlockM, Cfg::kBlockN, Cfg::kSwizzleBytes>(s, q_rows,
                                                                                                        k_tile);
}

template <class Cfg>
__device__ __forceinline__ void issue_pv_gemm(float (&o)[Cfg::kOCols / 2],
                                              const uint32_t (&p)[Cfg::kPvSteps][4],
                                              uint32_t v_tile) {
  using Mma = ptx::WgmmaRS<typename Cfg::Element, Cfg::kOCols>;
  if constexpr (Cfg::kVtSlices) {
    // An E4M3 cache's Vᵀ (KvCacheConfig): 16-key slices of head_dim rows x 16 B, no swizzle; LBO
    // (between the two core matrices of a k32 step along K) one slice, SBO (between 8-row
    // groups along N) 128 B; each k32 step two slices further.
    constexpr uint32_t kSliceBytes = Cfg::kHeadDim * 16;
    const uint64_t vd = ptx::make_plain_smem_desc(v_tile, kSliceBytes, 128);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kPvSteps; ++kk) Mma::mma(o, p[kk], advance(vd, kk * 2 * kSliceBytes), 1);
  } else if constexpr (Cfg::kFp8) {
    // Vᵀ: head_dim rows of 128 keys (128 B), K-major; each k32 step is 32 B further.
    const uint64_t vd = kmajor_desc<128>(v_tile);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kPvSteps; ++kk) Mma::mma(o, p[kk], advance(vd, kk * 32), 1);
  } else {
    // MN-major V: 64-column panels kBlockN x 128 B apart, 16 keys = 16 rows of 128 B per step.
    ptx::wgmma_fence();
    issue_register_gemm<typename Cfg::Element, Cfg::kOCols, Cfg::kPvSteps, Cfg::kBlockN * 128>(o, p, v_tile);
  }
}

// S (f32 accumulator) -> P as the A operand of the P·V GEMM.
// 16-bit: for keys 16kk..16kk+15 the accumulator registers s[8kk .. 8kk+7] already sit where
// the m64k16 A fragment wants them.
// FP8 (HOPPER-PRIMER.md §5.4): the m64k32 A fragment wants 4 consecutive keys per byte-packed
// register, the accumulator gives pairs. Swapping (s[8i+2], s[8i+3]) with (s[8i+4], s[8i+5])
// and packing 4 in order makes slot s of every 16 keys hold key kFp8KeyOrder[s], the order
// the quantisation pass gave Vᵀ: the product is the same sum in another order.
// kRow (0 or 1) converts only that row's registers (register r of each step holds row r % 2,
// in both layouts); -1 converts both.
template <class Cfg, int kRow = -1>
__device__ __forceinline__ void convert_to_operand(const float (&s)[Cfg::kBlockN / 2],
                                                   uint32_t (&p)[Cfg::kPvSteps][4]) {
  if constexpr (Cfg::kFp8) {
#pragma unroll
    for (int kk = 0; kk < Cfg::kPvSteps; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (kRow >= 0 && r % 2 != kRow) continue;
        // register r of step kk packs permuted slots 16kk + 4r .. +3; within each group of 8,
        // slots (2, 3) and (4, 5) trade places
        const int b = 16 * kk + 4 * r;
        const int g = b & ~7, o = b & 7;  // o is 0 or 4
        const float x0 = s[g + (o == 0 ? 0 : 2)], x1 = s[g + (o == 0 ? 1 : 3)];
        const float x2 = s[g + (o == 0 ? 4 : 6)], x3 = s[g + (o == 0 ? 5 : 7)];
        p[kk][r] = ptx::pack_e4m3x4(x0, x1, x2, x3);
      }
  } else {
    accumulator_to_operand<typename Cfg::Element, Cfg::kBlockN, kRow>(s, p);
  }
}

// P split in two 16-bit parts, hi = round(P) and lo = round(P - hi), so that
// hi·V + lo·V carries P to about 16 significant bits instead of 8 (bf16) or 11 (fp16).
template <class Cfg>
__device__ __forceinline__ void convert_to_split_operand(const float (&s)[Cfg::kBlockN / 2],
                                                         uint32_t (&hi)[Cfg::kBlockN / 16][4],
                                                         uint32_t (&lo)[Cfg::kBlockN / 16][4]) {
  using Element = typename Cfg::Element;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float a = s[8 * kk + 2 * i], b = s[8 * kk + 2 * i + 1];
      hi[kk][i] = ptx::pack_pair<Element>(a, b);
      const float2 h = ptx::unpack_pair<Element>(hi[kk][i]);
      lo[kk][i] = ptx::pack_pair<Element>(a - h.x, b - h.y);
    }
}

}  // namespace warpattn::detail
