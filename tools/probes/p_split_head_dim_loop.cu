// Head dim 512, step 3 of docs/headdim512-design.md (after p_split_head_dim.cu's steps 1 and 2,
// which passed on the H200 in run 133): the key loop. One CTA: a producer thread streams K and V
// tiles of 64 keys x 512 columns by TMA through a one-stage ring (K and V on barriers of their
// own), and two consumer warpgroups on the same 64 query rows each own half of the head dim:
// per key tile S_w = Q[:, half w] K[:, half w]^T, S = S_0 + S_1 through shared memory (two named
// barriers: after the writes, and after the reads, before the next tile's writes), the
// forward's OnlineSoftmax on S in both warpgroups (the same bits: the same S and the same code),
// O_w rescaled and O_w += P V[:, half w]. Non-causal, n_keys not a multiple of 64 (the last
// tile's keys past it masked; TMA zero-fills the rows past the tensor).
// Checks: O against fp64 (rel L2), the LSE against fp64, both warpgroups' LSE bitwise equal,
// outputs poisoned with NaN before the launch.
// Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_split_loop \
//     tools/probes/p_split_head_dim_loop.cu -lcuda && /tmp/p_split_loop
#include <cuda.h>
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
#include "hopper/softmax.cuh"
#include "probe_host.hpp"

using namespace warpattn;
using namespace warpattn::detail;

constexpr int kM = 64, kN = 64, kD = 512, kHalf = 256, kPanelBytes = 128;
constexpr int kPanelTileBytes = 64 * kPanelBytes;  // one 64-row panel: 8 KB
constexpr int kTileBytes = kM * kD * 2;            // 64 KB: Q, and a K or V tile of 64 keys
constexpr int kExchangeBytes = 2 * kM * kN * 4;    // each warpgroup's partial S
constexpr int kSmem = 1024 + 3 * kTileBytes + kExchangeBytes + 64;

struct Barriers {
  uint64_t q_full, k_full, v_full, k_empty, v_empty;
};

// The 8 panels (64 columns each) of rows row0 .. row0 + 63 of a (rows, 512) tensor.
__device__ __forceinline__ void load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row0) {
  ptx::mbarrier_arrive_expect_tx(bar, kTileBytes);
#pragma unroll
  for (int p = 0; p < kD / 64; ++p) ptx::tma_load_5d(dst + p * kPanelTileBytes, map, bar, 64 * p, row0, 0, 0, 0);
}

__global__ void __launch_bounds__(384, 1) split_head_dim_loop(const __grid_constant__ CUtensorMap tm_q,
                                                              const __grid_constant__ CUtensorMap tm_k,
                                                              const __grid_constant__ CUtensorMap tm_v, int n_keys,
                                                              float scale_log2, float* o_out, float* lse_out) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t sq = ptx::smem_addr(base), sk = sq + kTileBytes, sv = sk + kTileBytes;
  float* exchange = reinterpret_cast<float*>(base + 3 * kTileBytes);  // [2][64][64]
  auto& bars = *reinterpret_cast<Barriers*>(base + 3 * kTileBytes + kExchangeBytes);
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(ptx::smem_addr(&bars.q_full), 1);
    ptx::mbarrier_init(ptx::smem_addr(&bars.k_full), 1);
    ptx::mbarrier_init(ptx::smem_addr(&bars.v_full), 1);
    ptx::mbarrier_init(ptx::smem_addr(&bars.k_empty), 2);  // one arrival per consumer warpgroup
    ptx::mbarrier_init(ptx::smem_addr(&bars.v_empty), 2);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  const int n_tiles = (n_keys + kN - 1) / kN;
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {  // the producer: one thread; registers handed to the consumers (as the forward's)
    ptx::release_registers<40>();
    if (threadIdx.x == 0) {
      load_tile(sq, &tm_q, ptx::smem_addr(&bars.q_full), 0);
      for (int it = 0; it < n_tiles; ++it) {
        const uint32_t phase = it & 1;  // one stage: the slot's occupant of the previous lap must be gone
        ptx::mbarrier_wait(ptx::smem_addr(&bars.k_empty), phase ^ 1);
        load_tile(sk, &tm_k, ptx::smem_addr(&bars.k_full), it * kN);
        ptx::mbarrier_wait(ptx::smem_addr(&bars.v_empty), phase ^ 1);
        load_tile(sv, &tm_v, ptx::smem_addr(&bars.v_full), it * kN);
      }
    }
    return;
  }
  ptx::acquire_registers<232>();  // O alone is 128 registers a thread
  const int w = warpgroup - 1;
  const FragmentCoords f(threadIdx.x % 128);
  const uint32_t half_offset = w * (kHalf / 64) * kPanelTileBytes;  // this warpgroup's 4 panels
  float o[kHalf / 2];
#pragma unroll
  for (int i = 0; i < kHalf / 2; ++i) o[i] = 0.f;
  OnlineSoftmax softmax(0.f, 8.f);  // the 16-bit forward's (kPLog2Offset, kStaleLog2)
  ptx::mbarrier_wait(ptx::smem_addr(&bars.q_full), 0);
  for (int it = 0; it < n_tiles; ++it) {
    const uint32_t phase = it & 1;
    float s[kN / 2];
    ptx::mbarrier_wait(ptx::smem_addr(&bars.k_full), phase);
    issue_rows_gemm<__nv_bfloat16, kHalf / 64, kM, kN, kPanelBytes>(s, sq + half_offset, sk + half_offset);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(s);
    if (threadIdx.x % 128 == 0) ptx::mbarrier_arrive(ptx::smem_addr(&bars.k_empty));
    // S = S_0 + S_1, added in the same order by both warpgroups.
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) exchange[(w * kM + f.row(r)) * kN + f.col(j, c)] = s[4 * j + 2 * r + c];
    ptx::named_barrier_sync(1, 256);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int at = f.row(r) * kN + f.col(j, c);
          const float full = exchange[at] + exchange[kM * kN + at];
          s[4 * j + 2 * r + c] = it * kN + f.col(j, c) < n_keys ? full : -INFINITY;
        }
    ptx::named_barrier_sync(2, 256);  // both have read before either writes the next tile's
    float alpha[2];
    if (it == 0) {
      softmax.step<true>(s, alpha, scale_log2);
    } else {
      softmax.step<false>(s, alpha, scale_log2);
      rescale_rows(o, alpha);
    }
    uint32_t p[kN / 16][4];
    accumulator_to_operand<__nv_bfloat16, kN>(s, p);
    ptx::mbarrier_wait(ptx::smem_addr(&bars.v_full), phase);
    ptx::pin(o);
    ptx::pin(p);
    ptx::wgmma_fence();
    issue_register_gemm<__nv_bfloat16, kHalf, kN / 16, kPanelTileBytes>(o, p, sv + half_offset);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(o);
    if (threadIdx.x % 128 == 0) ptx::mbarrier_arrive(ptx::smem_addr(&bars.v_empty));
  }
  float lse[2];
  softmax.finalize(o, lse);
#pragma unroll
  for (int j = 0; j < kHalf / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) o_out[f.row(r) * kD + w * kHalf + f.col(j, c)] = o[4 * j + 2 * r + c];
  if (threadIdx.x % 4 == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) lse_out[w * kM + f.row(r)] = lse[r];
}

int main() {
  const int n_keys = 1000;  // 16 tiles, the last of 40 keys
  std::mt19937 rng(2027);
  std::vector<__nv_bfloat16> hq, hk, hv;
  std::vector<double> q, k, v;
  normal_bf16(rng, kM * kD, hq, q);
  normal_bf16(rng, size_t(n_keys) * kD, hk, k);
  normal_bf16(rng, size_t(n_keys) * kD, hv, v);
  const double scale = 1.0 / std::sqrt(double(kD));
  __nv_bfloat16 *dq, *dk, *dv;
  float *dout, *dlse;
  cudaMalloc(&dq, hq.size() * 2);
  cudaMalloc(&dk, hk.size() * 2);
  cudaMalloc(&dv, hv.size() * 2);
  cudaMalloc(&dout, kM * kD * 4);
  cudaMalloc(&dlse, 2 * kM * 4);
  cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dout, 0xFF, kM * kD * 4);  // NaN poison
  cudaMemset(dlse, 0xFF, 2 * kM * 4);
  const CUtensorMap tq = bf16_panel_map(dq, kD, kM, 64), tk = bf16_panel_map(dk, kD, n_keys, 64),
                    tv = bf16_panel_map(dv, kD, n_keys, 64);
  cudaFuncSetAttribute(split_head_dim_loop, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  split_head_dim_loop<<<1, 384, kSmem>>>(tq, tk, tv, n_keys, static_cast<float>(scale * M_LOG2E), dout, dlse);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::printf("FAIL: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::vector<float> o(kM * kD), lse(2 * kM);
  cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost);

  double num = 0, den = 0, lse_err = 0;
  int lse_differ = 0;
  bool finite = true;
  std::vector<double> pr(n_keys);
  for (int i = 0; i < kM; ++i) {
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < n_keys; ++j) {
      double acc = 0;
      for (int c = 0; c < kD; ++c) acc += q[i * kD + c] * k[j * kD + c];
      pr[j] = acc * scale;
      m = std::fmax(m, pr[j]);
    }
    for (int j = 0; j < n_keys; ++j) sum += pr[j] = std::exp(pr[j] - m);
    const double want_lse = m + std::log(sum);
    lse_differ += std::memcmp(&lse[i], &lse[kM + i], 4) != 0;
    lse_err = std::isfinite(lse[i]) ? std::fmax(lse_err, std::fabs(lse[i] - want_lse)) : INFINITY;
    for (int c = 0; c < kD; ++c) {
      double acc = 0;
      for (int j = 0; j < n_keys; ++j) acc += pr[j] * v[j * kD + c];
      acc /= sum;
      const double got = o[i * kD + c];
      finite = finite && std::isfinite(got);
      num += (got - acc) * (got - acc);
      den += acc * acc;
    }
  }
  const double rel_l2 = std::sqrt(num / den);
  const bool ok = finite && rel_l2 < 1e-2 && lse_err < 1e-3 && lse_differ == 0;
  std::printf("O: rel L2 against fp64 %.3e%s; LSE: max error %.3e, warpgroups differ in %d of %d rows\n", rel_l2,
              finite ? "" : " (non-finite values)", lse_err, lse_differ, kM);
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
