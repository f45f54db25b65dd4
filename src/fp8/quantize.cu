// The FP8 quantisation pass on the GPU: Q and K rows (optionally rotated) and V (transposed,
// keys in kFp8KeyOrder) to E4M3, with one descale per block of 128 rows per head; Q and K
// optionally to INT8 instead.
//
// One CTA per (block of 128 rows, head, batch). The pass is memory bound, so the block stays in
// registers between its amax and its codes (staging it in shared memory as fp32 needed up to
// 131 KB per CTA: one CTA per SM, nothing to overlap its load, compute and store phases),
// global loads are 16-byte vectors (stores 8 or 16 bytes), and shared memory is left to the
// cross-warp amax and V's byte-sized transpose, so that several CTAs share an SM.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/magic_int_float.hpp"
#include "fp8/quantize.hpp"
#include "hopper/cuda_check.hpp"
#include "hopper/backward/workspace.hpp"
#include "hopper/ptx/math.cuh"

namespace warpattn::detail {
namespace {

constexpr int kThreads = 256;  // max_reduce_kernel
constexpr int kWarps = kThreads / 32;
constexpr float kE4m3Max = 448.f;
constexpr float kInt8Max = 127.f;  // symmetric: -128 is never written
constexpr int kBlockRows = kFp8BlockRowsDevice;
static_assert(kBlockRows == 128, "the thread layouts below assume blocks of 128 rows");

// ------------------------------------------------------------------------------- helpers

// The amax of a block ignores NaN (like fmaxf) for E4M3 codes, which carry a NaN themselves;
// INT8 codes cannot, so there the amax propagates it and the block's descale becomes NaN.
template <bool kNan>
__device__ __forceinline__ float max2(float a, float b) {
  if constexpr (kNan) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
  } else {
    return fmaxf(a, b);
  }
}

// acc = max(acc, |w|) on pairs of 16-bit values, in their own format: one max.{bf16,f16}x2 per
// two elements instead of two conversions and two fp32 maxes (NaN as in max2).
template <class T, bool kNan>
__device__ __forceinline__ uint32_t max_abs2(uint32_t acc, uint32_t w) {
  using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  w &= 0x7fff7fffu;
  Pair a, b;
  memcpy(&a, &acc, 4);
  memcpy(&b, &w, 4);
  if constexpr (kNan)
    a = __hmax2_nan(a, b);
  else
    a = __hmax2(a, b);
  memcpy(&acc, &a, 4);
  return acc;
}
template <class T, bool kNan>
__device__ __forceinline__ float max_of_pair(uint32_t acc) {
  const float2 f = ptx::unpack_pair<T>(acc);
  return max2<kNan>(f.x, f.y);
}

// Two floats to two E4M3 bytes (RNE, saturating), `lo` in the low byte.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  return e4m3x2(a, b) | (e4m3x2(c, d) << 16);
}

// Four floats to four INT8 codes, `a` in the low byte: clamped to +-127, then rounded to the
// nearest integer (ties to even) by adding kMagicIntFloat, which leaves the integer in the low
// bits of the float; the low bytes are gathered by two byte permutes.
__device__ __forceinline__ uint32_t s8x4(float a, float b, float c, float d) {
  const auto low = [](float x) { return __float_as_uint(fminf(fmaxf(x, -kInt8Max), kInt8Max) + kMagicIntFloat); };
  return __byte_perm(__byte_perm(low(a), low(b), 0x0040), __byte_perm(low(c), low(d), 0x0040), 0x5410);
}

template <bool kInt8>
__device__ __forceinline__ uint32_t codes4(float a, float b, float c, float d) {
  if constexpr (kInt8)
    return s8x4(a, b, c, d);
  else
    return e4m3x4(a, b, c, d);
}

// The input is read exactly once: keep it out of L1.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a compile-time constant
}

template <int kWarpCount, bool kNan = false>
__device__ __forceinline__ float block_max(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) x = max2<kNan>(x, __shfl_xor_sync(0xffffffffu, x, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float m = 0.f;
#pragma unroll
  for (int w = 0; w < kWarpCount; ++w) m = max2<kNan>(m, scratch[w]);
  __syncthreads();  // scratch may be reused
  return m;
}

// The rows of a CTA's block: grid (blocks, heads, batch), or a packed batch's (padded blocks,
// heads, 1), whose block x stands for padded rows 128 x .. (one sequence's, or a gap's).
struct QuantBlock {
  int batch;     // the tensors' batch index (a packed batch's: 0)
  int in_row0;   // the block's first row in the input (and Q/K codes) tensor
  int rows;      // rows of the block that exist (0 .. 128)
};

__device__ __forceinline__ QuantBlock quant_block(const int* cu, int sequences, int seqlen) {
  const int x = static_cast<int>(blockIdx.x);
  if (cu != nullptr) {
    const int64_t padded = static_cast<int64_t>(x) * kBlockRows;
    const int b = sequence_of_padded_row(cu, sequences, seqlen, padded);
    const int off = min(max(cu[b], 0), seqlen), end = min(max(cu[b + 1], off), seqlen);
    const int before = static_cast<int>(padded - varlen_row0(off, b));  // the sequence's rows before the block
    return {0, off + before, max(0, min(kBlockRows, end - off - before))};
  }
  return {static_cast<int>(blockIdx.z), x * kBlockRows, max(0, min(kBlockRows, seqlen - x * kBlockRows))};
}

// 1 / sqrt(D), correctly rounded; a power of two (exact) for D = 64 and 256.
template <int D>
constexpr float kInvSqrt = D == 64 ? 0.125f : D == 128 ? 0.08838834764831844055f : 0.0625f;

// ---------------------------------------------------------------------------------- rows

// Thread layout of the rows kernel: `kLanes` lanes share a row, each holding kElems elements,
// so a CTA of 128 kLanes threads holds the whole block with one row segment per thread.
//  - Rotated: 64 fp32 values a lane (the fewest lanes per row, hence the fewest shuffle
//    stages of the transform, that fit the register file): 2 lanes per row at d <= 128, 4 at
//    d = 256. The block needs 128 D 4 bytes of registers: one CTA per SM at d = 256, three at 128.
//  - Not rotated: the raw 16-bit values are kept (converted again for the codes), 4 lanes per
//    row, so that each load and store instruction covers whole 32-byte sectors of a row.
template <int D, bool kRotate>
struct RowsLayout {
  static constexpr int kLanes = kRotate ? (D >= 128 ? D / 64 : 2) : 4;
  static constexpr int kElems = D / kLanes;
  static constexpr int kChunks = kElems / 8;  // 16-byte loads per lane
  static constexpr int kThreads = kBlockRows * kLanes;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kMinBlocks = kRotate ? (D >= 256 ? 1 : 3) : (D >= 256 ? 2 : D >= 128 ? 3 : 4);
  static_assert(kChunks >= 2, "the cross-lane stages exchange through slot bit 3");
};

// Rows (Q or K) of one (block, head, batch): load into registers, rotate, then either record the
// block's amax (amax_only, the first pass of per-tensor scaling) or quantise with the block's
// descale (per block) or the given global amax (per tensor).
//
// Loaded layout: lane c (of the row's kLanes = G) holds, in slot s = j + 8 k, element
// j + 8 c + 8 G k (chunk k is one 16-byte load; per instruction a row's G lanes read 16 G
// contiguous bytes). The Walsh-Hadamard transform is a butterfly on every bit of the element
// index, in any order: first on the bits held in the slot index (inside the thread), then on
// those in the lane index (c's bits), from the highest down.
// A cross-lane butterfly exchanges only half of the slots, which halves the shuffles: every
// lane keeps its slot s (bit 3 clear) and sends slot s + 8 to its partner; the lower lane of the
// pair then holds both operands of the butterflies whose slot bit 3 is 0, the upper lane those
// whose bit is 1, so the lane bit and slot bit 3 swap their meaning in the layout. For the upper
// lane's "slot s" to be the pair with bit 3 set, the stage before (the in-thread one on slot
// bit 3, or the previous cross-lane one) stores difference before sum in the next stage's upper
// lanes: x[s] = keep + tau other, x[s + 8] = keep - tau other with tau = -1 there, one FMA each
// instead of selects. An upper lane's difference comes out negated (upper - lower); these signs
// depend only on the lane and slot bit 3 and are tracked in sign_lo / sign_hi, applied with
// the scale. Afterwards slot s holds element (s & 15) + 16 c + 16 G (s >> 4): 16 consecutive
// codes per 16-byte store, and a row's G lanes store contiguous bytes.
template <class T, int D, bool kRotate, bool kInt8>
__global__ void __launch_bounds__(RowsLayout<D, kRotate>::kThreads, RowsLayout<D, kRotate>::kMinBlocks)
    quantize_rows_kernel(QuantizeRowsParams p) {
  using L = RowsLayout<D, kRotate>;
  constexpr int G = L::kLanes, N = L::kElems, C = L::kChunks;
  __shared__ float scratch[L::kWarps];
  __shared__ uint4 sign_xor[kRotate ? D / 8 : 1];  // per 8 elements: bit 15 / 31 of each pair
  const int block = blockIdx.x, head = blockIdx.y;
  const QuantBlock qb = quant_block(p.cu_seqlens, p.sequences, p.seqlen);
  const int batch = qb.batch;
  const int r = threadIdx.x / G, c = threadIdx.x % G;
  const int row = qb.in_row0 + r;
  const bool live = r < qb.rows;

  uint4 raw[C];
  {
    const T* src = static_cast<const T*>(p.in) + batch * p.in_stride[0] + row * p.in_stride[1] +
                   head * p.in_stride[2] + 8 * c;
#pragma unroll
    for (int k = 0; k < C; ++k) raw[k] = live ? load_streaming(src + 8 * G * k) : make_uint4(0, 0, 0, 0);
  }

  float x[kRotate ? N : 1];
  float sign_lo = 1.f, sign_hi = 1.f;  // the sign left on the slots with bit 3 clear / set
  float amax = 0.f;
  if constexpr (kRotate) {
    // The sign flips as xor masks on the packed 16-bit pairs (both formats keep the sign on top).
    if (threadIdx.x < D / 2) {
      const int e = 2 * threadIdx.x;
      const uint64_t bits = p.signs[e / 64] >> (e % 64);
      reinterpret_cast<uint32_t*>(sign_xor)[threadIdx.x] =
          (static_cast<uint32_t>(bits & 1) << 15) | (static_cast<uint32_t>((bits >> 1) & 1) << 31);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const uint4 m = sign_xor[c + G * k];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = ptx::unpack_pair<T>(word(raw[k], q) ^ word(m, q));
        x[8 * k + 2 * q] = f.x;
        x[8 * k + 2 * q + 1] = f.y;
      }
    }
    // Butterflies on the slot bits, inside the thread; slot bit 3 last, with the upper lanes of
    // the first cross-lane stage placing difference before sum (tau = -1, see above).
#pragma unroll
    for (int h = 1; h < N; h *= 2)
      if (h != 8)
#pragma unroll
        for (int i = 0; i < N; ++i)
          if (!(i & h)) {
            const float a = x[i], b = x[i + h];
            x[i] = a + b;
            x[i + h] = a - b;
          }
    {
      const float tau = (c & (G / 2)) ? -1.f : 1.f;
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (!(i & 8)) {
          const float a = x[i], b = x[i + 8];
          x[i] = __fmaf_rn(tau, b, a);
          x[i + 8] = __fmaf_rn(-tau, b, a);
        }
    }
#pragma unroll
    for (int m = G / 2; m >= 1; m /= 2) {  // across lanes, exchanging half (see above)
      const float tau = m > 1 && (c & (m / 2)) ? -1.f : 1.f;
#pragma unroll
      for (int s = 0; s < N; ++s)
        if (!(s & 8)) {
          const float keep = x[s], other = __shfl_xor_sync(0xffffffffu, x[s + 8], m);
          x[s] = __fmaf_rn(tau, other, keep);
          x[s + 8] = __fmaf_rn(-tau, other, keep);
        }
      if (c & m) {
        sign_lo = sign_hi;
        sign_hi = -sign_hi;
      } else {
        sign_hi = sign_lo;
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) amax = max2<kInt8>(amax, fabsf(x[i]));
  } else {
    uint32_t acc = 0;
#pragma unroll
    for (int k = 0; k < C; ++k)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc = max_abs2<T, kInt8>(acc, word(raw[k], q));
    amax = max_of_pair<T, kInt8>(acc);
  }

  float* descale = p.descale + batch * p.descale_stride[0] + head * p.descale_stride[1] + block * p.descale_stride[2];
  float scale_amax;
  if (p.mode == QuantizeMode::global_amax) {
    scale_amax = *p.global_amax;  // the block's own amax is not needed
  } else {
    amax = block_max<L::kWarps, kInt8>(amax, scratch);
    // The normalisation of the transform, applied to the max: rounding is monotonic, so this is
    // exactly the max of the normalised values.
    if constexpr (kRotate) amax *= kInvSqrt<D>;
    if (p.mode == QuantizeMode::amax_only) {
      if (threadIdx.x == 0) *descale = amax;
      return;
    }
    scale_amax = amax;
  }
  constexpr float kCodeMax = kInt8 ? kInt8Max : kE4m3Max;
  // A NaN amax (INT8 only) fails the test and must reach the descale.
  const float d = scale_amax > 0.f || scale_amax != scale_amax ? scale_amax / kCodeMax : 1.f;
  if (threadIdx.x == 0) *descale = d;
  const float inv = 1.f / d;
  if (!live) return;
  uint8_t* dst = static_cast<uint8_t*>(p.out) + batch * p.out_stride[0] + row * p.out_stride[1] +
                 head * p.out_stride[2];
  if constexpr (kRotate) {
    // (x norm) inv as written, with the sign left by the cross-lane stages; for d = 64 and 256
    // the norm is a power of two and folds exactly into the second factor.
    constexpr bool kFold = D != 128;
    const float pre = kFold ? 1.f : kInvSqrt<D>, post = kFold ? kInvSqrt<D> * inv : inv;
    const float pre_lo = pre * sign_lo, pre_hi = pre * sign_hi;
#pragma unroll
    for (int m = 0; m < N / 16; ++m) {
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float* v = x + 16 * m + 4 * q;
        const float f = q < 2 ? pre_lo : pre_hi;  // slot bit 3
        w[q] = kFold ? codes4<kInt8>(v[0] * (f * post), v[1] * (f * post), v[2] * (f * post), v[3] * (f * post))
                     : codes4<kInt8>(v[0] * f * post, v[1] * f * post, v[2] * f * post, v[3] * f * post);
      }
      *reinterpret_cast<uint4*>(dst + 16 * c + 16 * G * m) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < C; ++k) {
      uint32_t w[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 a = ptx::unpack_pair<T>(word(raw[k], 2 * h)), b = ptx::unpack_pair<T>(word(raw[k], 2 * h + 1));
        w[h] = codes4<kInt8>(a.x * inv, a.y * inv, b.x * inv, b.y * inv);
      }
      *reinterpret_cast<uint2*>(dst + 8 * c + 8 * G * k) = make_uint2(w[0], w[1]);
    }
  }
}

// The largest value of a strided (n0, n1, n2) array into *out (one CTA: the arrays are the
// per-block amaxes, a few thousand values). NaN propagates: only INT8's amaxes can hold one.
__global__ void max_reduce_kernel(const float* values, int64_t n0, int64_t n1, int64_t n2, int64_t s0,
                                  int64_t s1, int64_t s2, float* out) {
  __shared__ float scratch[kWarps];
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < n0 * n1 * n2; i += kThreads) {
    const int64_t c = i % n2, b = (i / n2) % n1, a = i / n2 / n1;
    m = max2<true>(m, values[a * s0 + b * s1 + c * s2]);
  }
  m = block_max<kWarps, true>(m, scratch);
  if (threadIdx.x == 0) *out = m;
}

// ------------------------------------------------------------------------------------ Vᵀ

// V of one (block of 128 keys, head, batch) to Vᵀ: out[d][16 g + s] = v[16 g + order[s]][d]
// / descale, zero past seqlen.
//
// A lane owns one 16-byte chunk (8 values of d) of the 4 keys that land in 4 adjacent columns,
// 16 g + 4 a .. 16 g + 4 a + 3, so its codes for one d form a 32-bit word of the output row.
// Lanes: a = lane / 8, chunk = lane % 8 (+ 8 per further 64 values of d); a warp thus reads
// 128 contiguous bytes of each of 4 keys per instruction. The raw 16-bit values stay in
// registers until the block's amax is known; the codes go through a D x 128-byte shared tile
// (32 KB at d = 256) whose 16-byte chunks are xor-swizzled by bits 3..5 of d, which keeps
// both the 32-bit writes and the 16-byte reads of whole output rows free of bank conflicts.
// Each (group, 64 values of d) is a task of a warp; D / 16 warps of 2 tasks cover the block.
template <int D>
struct VtLayout {
  static constexpr int kTasksPerWarp = 2;
  static constexpr int kWarps = D / 8 / kTasksPerWarp;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMinBlocks = D >= 256 ? 2 : 4;
};

template <class T, int D>
__global__ void __launch_bounds__(VtLayout<D>::kThreads, VtLayout<D>::kMinBlocks)
    quantize_vt_kernel(QuantizeVtParams p) {
  using L = VtLayout<D>;
  constexpr int kTasks = L::kTasksPerWarp;
  __shared__ alignas(16) uint8_t tile[D * kBlockRows];  // [d][column], chunks swizzled
  __shared__ float scratch[L::kWarps];
  const int block = blockIdx.x, head = blockIdx.y;
  const QuantBlock qb = quant_block(p.cu_seqlens, p.sequences, p.seqlen);
  const int batch = qb.batch;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int a = lane / 8, chunk = lane % 8;
  const int key0 = block * kBlockRows;  // the block's first column of Vᵀ
  const int keys_here = qb.rows;

  uint4 raw[kTasks][4];
  uint32_t acc = 0;
#pragma unroll
  for (int u = 0; u < kTasks; ++u) {
    const int task = warp * kTasks + u, g = task % 8, d0 = 64 * (task / 8) + 8 * chunk;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int key = 16 * g + p.order[4 * a + t];
      raw[u][t] = make_uint4(0, 0, 0, 0);  // zero past seqlen
      if (key < keys_here)
        raw[u][t] = load_streaming(static_cast<const T*>(p.in) + batch * p.in_stride[0] +
                                   static_cast<int64_t>(qb.in_row0 + key) * p.in_stride[1] + head * p.in_stride[2] +
                                   d0);
    }
  }
#pragma unroll
  for (int u = 0; u < kTasks; ++u)
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc = max_abs2<T, false>(acc, word(raw[u][t], q));

  float* descale = p.descale + batch * p.descale_stride[0] + head * p.descale_stride[1] + block * p.descale_stride[2];
  float scale_amax;
  if (p.mode == QuantizeMode::global_amax) {
    scale_amax = *p.global_amax;
  } else {
    const float amax = block_max<L::kWarps>(max_of_pair<T, false>(acc), scratch);
    if (p.mode == QuantizeMode::amax_only) {
      if (threadIdx.x == 0) *descale = amax;
      return;
    }
    scale_amax = amax;
  }
  const float d_scale = scale_amax > 0.f ? scale_amax / kE4m3Max : 1.f;
  if (threadIdx.x == 0) *descale = d_scale;
  const float inv = 1.f / d_scale;

#pragma unroll
  for (int u = 0; u < kTasks; ++u) {
    const int task = warp * kTasks + u, g = task % 8, d0 = 64 * (task / 8) + 8 * chunk;
    // Row d0 + e, column word 4 g + a; chunk g moved to g ^ ((d >> 3) & 7) = g ^ chunk.
    uint8_t* at = tile + d0 * kBlockRows + 16 * (g ^ chunk) + 4 * a;
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // values 2q, 2q + 1 of d in each key's chunk
      float2 f[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) f[t] = ptx::unpack_pair<T>(word(raw[u][t], q));
      *reinterpret_cast<uint32_t*>(at + (2 * q) * kBlockRows) =
          e4m3x4(f[0].x * inv, f[1].x * inv, f[2].x * inv, f[3].x * inv);
      *reinterpret_cast<uint32_t*>(at + (2 * q + 1) * kBlockRows) =
          e4m3x4(f[0].y * inv, f[1].y * inv, f[2].y * inv, f[3].y * inv);
    }
  }
  __syncthreads();

  // Columns of this block inside the padded row: up to 128, fewer in the last block; a multiple
  // of 16. Eight consecutive threads write one row's 128 bytes.
  const int cols = static_cast<int>(p.padded_keys - key0 < kBlockRows ? p.padded_keys - key0 : kBlockRows);
  uint8_t* out = static_cast<uint8_t*>(p.out) + batch * p.out_stride[0] + head * p.out_stride[1] + key0;
#pragma unroll
  for (int i = threadIdx.x; i < D * 8; i += L::kThreads) {
    const int d = i / 8, m = i % 8;
    if (16 * m >= cols) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + d * kBlockRows + 16 * (m ^ ((d >> 3) & 7)));
    *reinterpret_cast<uint4*>(out + d * p.out_stride[2] + 16 * m) = v;
  }
}

// -------------------------------------------------------------------------------- launch

// Grid dimensions y and z stop at 65535: (heads, batch) go in chunks of that many, each
// chunk's pointers moved to its first head and batch, so the kernels count from 0 in each.
constexpr int kGridYZLimit = 65535;

// `p` moved to batch b0, head h0; `out_head_axis` is the head's stride index in p.out_stride
// (2 for Q and K rows, 1 for Vᵀ). Inputs are 16-bit, codes 1 byte.
template <class Params>
Params at_chunk(Params p, int64_t b0, int64_t h0, int out_head_axis) {
  p.in = static_cast<const char*>(p.in) + 2 * (b0 * p.in_stride[0] + h0 * p.in_stride[2]);
  p.out = static_cast<char*>(p.out) + b0 * p.out_stride[0] + h0 * p.out_stride[out_head_axis];
  p.descale += b0 * p.descale_stride[0] + h0 * p.descale_stride[1];
  return p;
}

template <class Params, class Launch>
void for_each_chunk(const Params& p, int heads, int batch, int out_head_axis, const Launch& launch) {
  for (int b0 = 0; b0 < batch; b0 += kGridYZLimit)
    for (int h0 = 0; h0 < heads; h0 += kGridYZLimit)
      launch(at_chunk(p, b0, h0, out_head_axis), std::min(heads - h0, kGridYZLimit), std::min(batch - b0, kGridYZLimit));
}

template <class T, int D, bool kRotate>
void launch_rows(const QuantizeRowsParams& params, int blocks, int heads, int batch, cudaStream_t stream) {
  for_each_chunk(params, heads, batch, 2, [&](const QuantizeRowsParams& p, int h, int b) {
    const dim3 grid(blocks, h, b);
    if (p.int8_codes)
      quantize_rows_kernel<T, D, kRotate, true><<<grid, RowsLayout<D, kRotate>::kThreads, 0, stream>>>(p);
    else
      quantize_rows_kernel<T, D, kRotate, false><<<grid, RowsLayout<D, kRotate>::kThreads, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "quantize_rows_kernel: launch failed");
  });
}

template <class T, int D>
void launch_vt(const QuantizeVtParams& params, int blocks, int heads, int batch, cudaStream_t stream) {
  for_each_chunk(params, heads, batch, 1, [&](const QuantizeVtParams& p, int h, int b) {
    quantize_vt_kernel<T, D><<<dim3(blocks, h, b), VtLayout<D>::kThreads, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "quantize_vt_kernel: launch failed");
  });
}

template <class T, int D>
void launch_rows_r(const QuantizeRowsParams& p, int blocks, int heads, int batch, cudaStream_t s) {
  if (p.rotate) return launch_rows<T, D, true>(p, blocks, heads, batch, s);
  return launch_rows<T, D, false>(p, blocks, heads, batch, s);
}
template <class T>
void launch_rows_d(int d, const QuantizeRowsParams& p, int blocks, int heads, int batch, cudaStream_t s) {
  if (d == 64) return launch_rows_r<T, 64>(p, blocks, heads, batch, s);
  if (d == 128) return launch_rows_r<T, 128>(p, blocks, heads, batch, s);
  return launch_rows_r<T, 256>(p, blocks, heads, batch, s);
}
template <class T>
void launch_vt_d(int d, const QuantizeVtParams& p, int blocks, int heads, int batch, cudaStream_t s) {
  if (d == 64) return launch_vt<T, 64>(p, blocks, heads, batch, s);
  if (d == 128) return launch_vt<T, 128>(p, blocks, heads, batch, s);
  return launch_vt<T, 256>(p, blocks, heads, batch, s);
}

}  // namespace

void launch_quantize_rows(DType dtype, int head_dim, const QuantizeRowsParams& p, int blocks, int heads,
                          int batch, cudaStream_t stream) {
  if (dtype == DType::bf16)
    launch_rows_d<__nv_bfloat16>(head_dim, p, blocks, heads, batch, stream);
  else
    launch_rows_d<__half>(head_dim, p, blocks, heads, batch, stream);
}

void launch_quantize_vt(DType dtype, int head_dim, const QuantizeVtParams& p, int blocks, int heads, int batch,
                        cudaStream_t stream) {
  if (dtype == DType::bf16)
    launch_vt_d<__nv_bfloat16>(head_dim, p, blocks, heads, batch, stream);
  else
    launch_vt_d<__half>(head_dim, p, blocks, heads, batch, stream);
}

void launch_max_reduce(const float* values, const int64_t (&n)[3], const int64_t (&s)[3], float* out,
                       cudaStream_t stream) {
  max_reduce_kernel<<<1, kThreads, 0, stream>>>(values, n[0], n[1], n[2], s[0], s[1], s[2], out);
  check_cuda(cudaGetLastError(), "max_reduce_kernel: launch failed");
}

}  // namespace warpattn::detail
