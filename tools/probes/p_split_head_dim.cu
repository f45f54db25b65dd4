// Head dim 512, steps 1 and 2 of docs/headdim512-design.md, before any kernel: one CTA, two
// warpgroups on the same 64 query rows, each owning half (256 columns) of the head dim.
//   1. S_w = Q[:, half w] K[:, half w]^T (SS wgmma m64n64k16, 16 k steps, the forward's
//      issue_rows_gemm over 4 panels), S = S_0 + S_1 through shared memory: both warpgroups'
//      S must be bitwise equal, and equal to a CPU S.
//   2. P = softmax(scale S) in each warpgroup (the same P in both), O_w = P V[:, half w] (RS wgmma
//      m64n256k16 x 4, the forward's issue_register_gemm), against an fp64 reference.
// Q, K, V (64 x 512 bf16) are stored into shared memory by plain stores in the TMA layout the
// kernels read (128-byte panels of 64 columns, 128B-swizzled: 16-byte chunk c of row r at
// c ^ (r % 8)). Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o p_split tools/probes/p_split_head_dim.cu && ./p_split
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "hopper/consumer_gemms.cuh"
#include "hopper/fragment.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"

using namespace warpattn;
using namespace warpattn::detail;

constexpr int kM = 64, kN = 64, kD = 512, kHalf = 256, kPanelBytes = 128;
constexpr int kTileBytes = kM * kD * 2;  // 64 KB: Q, K and V alike (64 rows)
constexpr int kSmem = 3 * kTileBytes + 2 * kM * kN * 4 + 1024;

// Row r, column c of a 64-row tile in 128-byte swizzled panels of 64 columns.
__device__ __forceinline__ int swizzled_offset(int r, int c) {
  const int panel = c / 64, byte = (c % 64) * 2;
  return panel * kM * kPanelBytes + r * kPanelBytes + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
}

__global__ void __launch_bounds__(256) split_head_dim(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                      const __nv_bfloat16* v, float scale_log2, float* s_out,
                                                      float* o_out) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* sq = base;
  uint8_t* sk = base + kTileBytes;
  uint8_t* sv = base + 2 * kTileBytes;
  float* exchange = reinterpret_cast<float*>(base + 3 * kTileBytes);  // [2][64][64]
  for (int i = threadIdx.x; i < kM * kD; i += blockDim.x) {
    const int r = i / kD, c = i % kD;
    *reinterpret_cast<__nv_bfloat16*>(sq + swizzled_offset(r, c)) = q[i];
    *reinterpret_cast<__nv_bfloat16*>(sk + swizzled_offset(r, c)) = k[i];
    *reinterpret_cast<__nv_bfloat16*>(sv + swizzled_offset(r, c)) = v[i];
  }
  ptx::fence_proxy_async_shared();
  __syncthreads();

  const int w = threadIdx.x / 128;
  const FragmentCoords f(threadIdx.x % 128);
  const uint32_t half_offset = w * (kHalf / 64) * kM * kPanelBytes;  // 4 panels of 8 KB
  float s[kN / 2];
  issue_rows_gemm<__nv_bfloat16, kHalf / 64, kM, kN, kPanelBytes>(s, ptx::smem_addr(sq) + half_offset,
                                                                  ptx::smem_addr(sk) + half_offset);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::pin(s);

  // The partial sums meet in shared memory; both warpgroups add them in the same order.
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) exchange[(w * kM + f.row(r)) * kN + f.col(j, c)] = s[4 * j + 2 * r + c];
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int at = f.row(r) * kN + f.col(j, c);
        const float full = exchange[at] + exchange[kM * kN + at];
        s[4 * j + 2 * r + c] = full;
        s_out[(w * kM + f.row(r)) * kN + f.col(j, c)] = full;
      }

  // Softmax per row (the quad of 4 lanes holds a row's 64 columns), unnormalised P.
  float row_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    m = quad_max(m);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = s[4 * j + 2 * r + c];
        x = ptx::exp2_approx((x - m) * scale_log2);
        sum += x;
      }
    row_sum[r] = quad_sum(sum);
  }
  uint32_t p[kN / 16][4];
  accumulator_to_operand<__nv_bfloat16, kN>(s, p);
  float o[kHalf / 2];
#pragma unroll
  for (int i = 0; i < kHalf / 2; ++i) o[i] = 0.f;
  ptx::pin(p);
  ptx::wgmma_fence();
  issue_register_gemm<__nv_bfloat16, kHalf, kN / 16, kM * kPanelBytes>(o, p, ptx::smem_addr(sv) + half_offset);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::pin(o);
#pragma unroll
  for (int j = 0; j < kHalf / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        o_out[f.row(r) * kD + w * kHalf + f.col(j, c)] = o[4 * j + 2 * r + c] / row_sum[r];
}

int main() {
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<__nv_bfloat16> hq(kM * kD), hk(kN * kD), hv(kN * kD);
  std::vector<double> q(kM * kD), k(kN * kD), v(kN * kD);
  for (int i = 0; i < kM * kD; ++i) {
    hq[i] = __float2bfloat16(normal(rng));
    hk[i] = __float2bfloat16(normal(rng));
    hv[i] = __float2bfloat16(normal(rng));
    q[i] = __bfloat162float(hq[i]);
    k[i] = __bfloat162float(hk[i]);
    v[i] = __bfloat162float(hv[i]);
  }
  const double scale = 1.0 / std::sqrt(double(kD));
  __nv_bfloat16 *dq, *dk, *dv;
  float *ds, *dout;
  cudaMalloc(&dq, kM * kD * 2);
  cudaMalloc(&dk, kN * kD * 2);
  cudaMalloc(&dv, kN * kD * 2);
  cudaMalloc(&ds, 2 * kM * kN * 4);
  cudaMalloc(&dout, kM * kD * 4);
  cudaMemcpy(dq, hq.data(), kM * kD * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, hk.data(), kN * kD * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, hv.data(), kN * kD * 2, cudaMemcpyHostToDevice);
  cudaMemset(ds, 0xFF, 2 * kM * kN * 4);  // NaN poison
  cudaMemset(dout, 0xFF, kM * kD * 4);
  cudaFuncSetAttribute(split_head_dim, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  split_head_dim<<<1, 256, kSmem>>>(dq, dk, dv, static_cast<float>(scale * M_LOG2E), ds, dout);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::printf("FAIL: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::vector<float> s(2 * kM * kN), o(kM * kD);
  cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost);

  // 1. Both warpgroups' S bitwise equal; S against the CPU.
  int differ = 0;
  double s_err = 0, s_max = 0;
  std::vector<double> ref_s(kM * kN);
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      double acc = 0;
      for (int c = 0; c < kD; ++c) acc += q[i * kD + c] * k[j * kD + c];
      ref_s[i * kN + j] = acc;
      differ += std::memcmp(&s[i * kN + j], &s[kM * kN + i * kN + j], 4) != 0;
      s_err = std::fmax(s_err, std::fabs(s[i * kN + j] - acc));  // NaN stays the max (fmax drops it: checked below)
      if (!std::isfinite(s[i * kN + j])) s_err = INFINITY;
      s_max = std::fmax(s_max, std::fabs(acc));
    }
  // 2. O against fp64 (P unrounded there: the error is P's bf16 rounding and V's products).
  double num = 0, den = 0;
  bool finite = true;
  for (int i = 0; i < kM; ++i) {
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < kN; ++j) m = std::fmax(m, ref_s[i * kN + j] * scale);
    std::vector<double> pr(kN);
    for (int j = 0; j < kN; ++j) sum += pr[j] = std::exp(ref_s[i * kN + j] * scale - m);
    for (int c = 0; c < kD; ++c) {
      double acc = 0;
      for (int j = 0; j < kN; ++j) acc += pr[j] * v[j * kD + c];
      acc /= sum;
      const double got = o[i * kD + c];
      finite = finite && std::isfinite(got);
      num += (got - acc) * (got - acc);
      den += acc * acc;
    }
  }
  const double rel_l2 = std::sqrt(num / den);
  const bool ok = differ == 0 && s_err <= 1e-5 * s_max + 1e-4 && finite && rel_l2 < 1e-2;
  std::printf("S: warpgroups differ at %d of %d; max |S - S_cpu| %.3e (max |S| %.1f)\n", differ, kM * kN, s_err, s_max);
  std::printf("O: rel L2 against fp64 %.3e%s\n", rel_l2, finite ? "" : " (non-finite values)");
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
