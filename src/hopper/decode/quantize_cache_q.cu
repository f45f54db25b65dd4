// quantize_cache_q (quantize_cache_q.hpp): a CTA per work tile, two passes over its elements
// (the tile is at most 128 rows x head_dim, 64 KB of 16-bit q: the second pass reads L1/L2),
// 8 elements a thread per 16-byte load, over the tile's rows below seqlen_q only (a decode
// step's tile holds group rows of its 128) and in 32-bit index arithmetic: with 64-bit division
// over every row of the tile it took 5.9 us at B = 8 and 10.9 us at B = 64 (run 191), 7% of
// the E4M3 step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "hopper/cuda_check.hpp"
#include "hopper/decode/e4m3_code.cuh"
#include "hopper/decode/quantize_cache_q.hpp"
#include "hopper/ptx/grid_dependency.cuh"

namespace warpattn::detail {
namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.f;

struct QuantizeQArgs {
  const char* q;
  int64_t stride[3];  // q's batch, position, head strides (elements)
  uint8_t* codes;
  float* descales;
  int seqlen_q, heads_q, head_dim;
  GqaPacking packing;
  int m_blocks, chunks;  // the tiles: blocks of positions (fastest) x chunks x sequences
};

// Tile u (blockIdx.x) of the grid: its block of positions, chunk of heads and sequence.
struct QTile {
  int m_block, chunk, batch;
};
__device__ __forceinline__ QTile q_tile(const QuantizeQArgs& a) {
  const int u = static_cast<int>(blockIdx.x);
  return {u % a.m_blocks, u / a.m_blocks % a.chunks, u / a.m_blocks / a.chunks};
}

// The tile's elements below seqlen_q: its rows are position-major (row = position in the tile
// x heads + head in the chunk), so they are its first rows, (valid positions) x heads x d
// elements (at most 128 x 512: 32-bit).
__device__ __forceinline__ int tile_elements(const QuantizeQArgs& a, const QTile& u) {
  const int positions = min(a.packing.positions, a.seqlen_q - u.m_block * a.packing.positions);
  return positions * a.packing.heads * a.head_dim;
}

// The tile's element e (8 at a time): row e / head_dim of the tile, position row / heads and
// head row % heads of the chunk.
struct TileElement {
  int64_t in, out;  // element offsets into q and the codes
};
__device__ __forceinline__ TileElement tile_element(const QuantizeQArgs& a, const QTile& u, int e) {
  const int d = a.head_dim, heads = a.packing.heads;
  const int row = e / d, col = e % d;
  const int position = u.m_block * a.packing.positions + row / heads;
  const int head = u.chunk * heads + row % heads;
  const int64_t b = u.batch;
  return {b * a.stride[0] + position * a.stride[1] + head * a.stride[2] + col,
          ((b * a.seqlen_q + position) * a.heads_q + head) * d + col};
}

template <class T>
__global__ void __launch_bounds__(kThreads) quantize_cache_q_kernel(const __grid_constant__ QuantizeQArgs a) {
  __shared__ float warp_max[kThreads / 32];
  // The step's attention, launched as this grid's dependent, may take the SMs this grid leaves
  // from here on: it waits for this grid's end before it reads the codes (forward_kernel.cuh).
  ptx::allow_dependent_launch();
  const T* q = reinterpret_cast<const T*>(a.q);
  const QTile u = q_tile(a);
  const int elements = tile_elements(a, u);
  float amax = 0.f;
  for (int e = 8 * static_cast<int>(threadIdx.x); e < elements; e += 8 * kThreads) {
    const TileElement t = tile_element(a, u, e);
    const uint4 raw = *reinterpret_cast<const uint4*>(q + t.in);
    const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(to_float(x[i])));  // (fmaxf drops a NaN)
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float descale = amax > 0.f ? amax / kE4m3Max : 1.f;
  if (threadIdx.x == 0)
    a.descales[blockIdx.x] = descale;  // (B, chunks, m_blocks), contiguous: the tile's index
  for (int e = 8 * static_cast<int>(threadIdx.x); e < elements; e += 8 * kThreads) {
    const TileElement t = tile_element(a, u, e);
    const uint4 raw = *reinterpret_cast<const uint4*>(q + t.in);
    const T* x = reinterpret_cast<const T*>(&raw);
    uint8_t c[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)  // (an IEEE division, as the host's reference divides)
      c[i] = e4m3_code(to_float(x[i]), descale);
    *reinterpret_cast<uint2*>(a.codes + t.out) = *reinterpret_cast<const uint2*>(c);
  }
}

}  // namespace

void quantize_cache_q(const TensorView& q, void* codes, float* descales, const GqaPacking& packing,
                      cudaStream_t stream) {
  QuantizeQArgs a{static_cast<const char*>(q.data),
                  {q.stride[0], q.stride[1], q.stride[2]},
                  static_cast<uint8_t*>(codes),
                  descales,
                  static_cast<int>(q.shape[1]),
                  static_cast<int>(q.shape[2]),
                  static_cast<int>(q.shape[3]),
                  packing,
                  (static_cast<int>(q.shape[1]) + packing.positions - 1) / packing.positions,
                  static_cast<int>(q.shape[2]) / packing.heads};
  // (validation keeps the tiles below 2^31)
  const int64_t tiles = q.shape[0] * a.m_blocks * a.chunks;
  if (tiles == 0) return;
  const dim3 grid(static_cast<unsigned>(tiles));
  if (q.dtype == DType::bf16)
    quantize_cache_q_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  else
    quantize_cache_q_kernel<__half><<<grid, kThreads, 0, stream>>>(a);
  check_cuda(cudaGetLastError(), "quantize_cache_q_kernel: launch failed");
}

}  // namespace warpattn::detail
