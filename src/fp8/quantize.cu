// The FP8 quantisation pass on the GPU: Q and K rows (optionally rotated) and V (transposed,
// keys in kFp8KeyOrder) to E4M3, with one descale per block of 128 rows per head.
//
// One CTA per (block of 128 rows, head, batch). A warp owns a row at a time: lane l holds the
// row's elements [l E, l E + E) (E = D / 32), so a row is read with one vector load per lane,
// and the Walsh-Hadamard butterflies run inside a thread for strides < E and across lanes
// (shfl.xor) above. The rotated block is kept in shared memory as fp32 until its amax is known.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "fp8/quantize.hpp"
#include "hopper/cuda_check.hpp"

namespace warpattn::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr float kE4m3Max = 448.f;

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Two floats to two E4M3 bytes (RNE, saturating), `lo` in the low byte.
__device__ __forceinline__ uint16_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float block_max(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float m = 0.f;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();  // scratch may be reused
  return m;
}

// Rows (Q or K) of one (block, head, batch): rotate into shared memory, then either record the
// block's amax (amax_only, the first pass of per-tensor scaling) or quantise with the block's
// descale (per block) or the given global amax (per tensor).
template <class T, int D>
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(QuantizeRowsParams p) {
  constexpr int E = D / 32;
  extern __shared__ float rows[];  // [128][D]
  __shared__ float scratch[kWarps];
  const int block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int row0 = block * kFp8BlockRowsDevice;
  const int rows_here = min(kFp8BlockRowsDevice, p.seqlen - row0);

  float amax = 0.f;
  for (int r = warp; r < rows_here; r += kWarps) {
    const T* src = static_cast<const T*>(p.in) + batch * p.in_stride[0] + (row0 + r) * p.in_stride[1] +
                   head * p.in_stride[2] + lane * E;
    float x[E];
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] = to_float(src[i]);
    if (p.rotate) {
#pragma unroll
      for (int i = 0; i < E; ++i)
        if ((p.signs[(lane * E + i) / 64] >> ((lane * E + i) % 64)) & 1) x[i] = -x[i];
#pragma unroll
      for (int h = 1; h < E; h *= 2)  // butterflies inside the thread
#pragma unroll
        for (int i = 0; i < E; ++i)
          if (!(i & h)) {
            const float a = x[i], b = x[i + h];
            x[i] = a + b;
            x[i + h] = a - b;
          }
#pragma unroll
      for (int m = 1; m < 32; m *= 2) {  // across lanes: element stride m E
        const bool upper = lane & m;
#pragma unroll
        for (int i = 0; i < E; ++i) {
          const float other = __shfl_xor_sync(0xffffffffu, x[i], m);
          x[i] = upper ? other - x[i] : x[i] + other;
        }
      }
      const float norm = rsqrtf(static_cast<float>(D));
#pragma unroll
      for (int i = 0; i < E; ++i) x[i] *= norm;
    }
#pragma unroll
    for (int i = 0; i < E; ++i) {
      amax = fmaxf(amax, fabsf(x[i]));
      rows[r * D + lane * E + i] = x[i];
    }
  }
  amax = block_max(amax, scratch);
  float* descale = p.descale + batch * p.descale_stride[0] + head * p.descale_stride[1] + block * p.descale_stride[2];
  if (p.mode == QuantizeMode::amax_only) {
    if (threadIdx.x == 0) *descale = amax;
    return;
  }
  const float scale_amax = p.mode == QuantizeMode::global_amax ? *p.global_amax : amax;
  const float d = scale_amax > 0.f ? scale_amax / kE4m3Max : 1.f;
  if (threadIdx.x == 0) *descale = d;
  const float inv = 1.f / d;
  for (int r = warp; r < rows_here; r += kWarps) {
    uint8_t* dst = static_cast<uint8_t*>(p.out) + batch * p.out_stride[0] + (row0 + r) * p.out_stride[1] +
                   head * p.out_stride[2] + lane * E;
    const float* x = rows + r * D + lane * E;
#pragma unroll
    for (int i = 0; i < E; i += 2) {
      const uint16_t pair = e4m3x2(x[i] * inv, x[i + 1] * inv);
      *reinterpret_cast<uint16_t*>(dst + i) = pair;
    }
  }
}

// The largest value of a strided (n0, n1, n2) array into *out (one CTA: the arrays are the
// per-block amaxes, a few thousand values).
__global__ void max_reduce_kernel(const float* values, int64_t n0, int64_t n1, int64_t n2, int64_t s0,
                                  int64_t s1, int64_t s2, float* out) {
  __shared__ float scratch[kWarps];
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < n0 * n1 * n2; i += kThreads) {
    const int64_t c = i % n2, b = (i / n2) % n1, a = i / n2 / n1;
    m = fmaxf(m, values[a * s0 + b * s1 + c * s2]);
  }
  m = block_max(m, scratch);
  if (threadIdx.x == 0) *out = m;
}

// V of one (block of 128 keys, head, batch) to Vᵀ: out[d][16 g + s] = v[16 g + order[s]][d]
// / descale, zero past seqlen. Keys go through shared memory as fp32.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) quantize_vt_kernel(QuantizeVtParams p) {
  extern __shared__ float keys[];  // [128][D + 1]: the +1 keeps the transposed reads conflict-free
  __shared__ float scratch[kWarps];
  constexpr int kPitch = D + 1;
  const int block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int key0 = block * kFp8BlockRowsDevice;
  const int keys_here = min(kFp8BlockRowsDevice, p.seqlen - key0);
  float amax = 0.f;
  for (int i = threadIdx.x; i < kFp8BlockRowsDevice * D; i += kThreads) {
    const int key = i / D, d = i % D;
    float x = 0.f;
    if (key < keys_here)
      x = to_float(static_cast<const T*>(p.in)[batch * p.in_stride[0] + (key0 + key) * p.in_stride[1] +
                                               head * p.in_stride[2] + d]);
    keys[key * kPitch + d] = x;
    amax = fmaxf(amax, fabsf(x));
  }
  amax = block_max(amax, scratch);  // also the barrier after the writes above
  const float scale_amax = p.mode == QuantizeMode::global_amax ? *p.global_amax : amax;
  if (p.mode == QuantizeMode::amax_only) {
    if (threadIdx.x == 0)
      p.descale[batch * p.descale_stride[0] + head * p.descale_stride[1] + block * p.descale_stride[2]] = amax;
    return;
  }
  const float d_scale = scale_amax > 0.f ? scale_amax / kE4m3Max : 1.f;
  if (threadIdx.x == 0)
    p.descale[batch * p.descale_stride[0] + head * p.descale_stride[1] + block * p.descale_stride[2]] = d_scale;
  const float inv = 1.f / d_scale;
  // Columns of this block inside the padded row: up to 128, fewer in the last block.
  const int cols = static_cast<int>(p.padded_keys - key0 < kFp8BlockRowsDevice ? p.padded_keys - key0 : kFp8BlockRowsDevice);
  // Each thread writes 4 consecutive columns of one d row.
  for (int i = threadIdx.x; i < D * (cols / 4); i += kThreads) {
    const int d = i / (cols / 4), c = 4 * (i % (cols / 4));
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = c + j;
      const int key = (col & ~15) + p.order[col & 15];
      v[j] = keys[key * kPitch + d] * inv;  // zero past seqlen
    }
    const uint32_t word = e4m3x2(v[0], v[1]) | (static_cast<uint32_t>(e4m3x2(v[2], v[3])) << 16);
    uint8_t* dst = static_cast<uint8_t*>(p.out) + batch * p.out_stride[0] + head * p.out_stride[1] +
                   d * p.out_stride[2] + key0 + c;
    *reinterpret_cast<uint32_t*>(dst) = word;
  }
}

template <class T, int D>
void launch_rows(const QuantizeRowsParams& p, int blocks, int heads, int batch, cudaStream_t stream) {
  const int smem = kFp8BlockRowsDevice * D * 4;
  auto kernel = quantize_rows_kernel<T, D>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "quantize_rows_kernel: setting its shared-memory size");
  kernel<<<dim3(blocks, heads, batch), kThreads, smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "quantize_rows_kernel: launch failed");
}

template <class T, int D>
void launch_vt(const QuantizeVtParams& p, int blocks, int heads, int batch, cudaStream_t stream) {
  const int smem = kFp8BlockRowsDevice * (D + 1) * 4;
  auto kernel = quantize_vt_kernel<T, D>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "quantize_vt_kernel: setting its shared-memory size");
  kernel<<<dim3(blocks, heads, batch), kThreads, smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "quantize_vt_kernel: launch failed");
}

template <class T>
void launch_rows_d(int d, const QuantizeRowsParams& p, int blocks, int heads, int batch, cudaStream_t s) {
  if (d == 64) return launch_rows<T, 64>(p, blocks, heads, batch, s);
  if (d == 128) return launch_rows<T, 128>(p, blocks, heads, batch, s);
  return launch_rows<T, 256>(p, blocks, heads, batch, s);
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
