// The decode tile's protocol (docs/decode-design.md), before any kernel: both consumer
// warpgroups on the same 64 query rows, taking alternate key tiles of one ring. One CTA: a
// producer thread streams K and V tiles of 128 keys x 128 columns by TMA through a 3-stage ring
// whose empty barriers count two arrivals, as the forward's; warpgroup w reads the tiles of
// ordinal w, w + 2, ... and, being a stage's only reader, releases it with one arrival of count
// 2; no ping-pong turns. Each warpgroup runs the forward's OnlineSoftmax over its own tiles and
// leaves (O unnormalised, row reference, row sum) as a partial state, which the host merges the
// way the split combine does (PartialState::add_to) and compares with fp64. 9 key tiles (the
// last 76 keys of 128): warpgroup 0 takes 5, warpgroup 1 takes 4.
// Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_alt \
//     tools/probes/p_alternating_key_tiles.cu -lcuda && timeout 60 /tmp/p_alt
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
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

constexpr int kM = 64, kN = 128, kD = 128, kStages = 3, kPanelBytes = 128;
constexpr int kQBytes = kM * kD * 2;   // 16 KB: two panels of 64 rows
constexpr int kKVBytes = kN * kD * 2;  // 32 KB: two panels of 128 rows
constexpr int kSmem = 1024 + kQBytes + 2 * kStages * kKVBytes + 256;

struct Barriers {
  uint64_t q_full, k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages];
};

// One arrival that counts for `count`: a stage's only reader stands in for both warpgroups.
__device__ __forceinline__ void arrive_count(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// The 2 panels (64 columns each) of `rows` rows from row0 of a (rows, 128) tensor.
__device__ __forceinline__ void load_rows(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row0, int rows) {
  ptx::mbarrier_arrive_expect_tx(bar, rows * kD * 2);
#pragma unroll
  for (int p = 0; p < kD / 64; ++p) ptx::tma_load_5d(dst + p * rows * kPanelBytes, map, bar, 64 * p, row0, 0, 0, 0);
}

__global__ void __launch_bounds__(384, 1) alternating_key_tiles(const __grid_constant__ CUtensorMap tm_q,
                                                                const __grid_constant__ CUtensorMap tm_k,
                                                                const __grid_constant__ CUtensorMap tm_v, int n_keys,
                                                                float scale_log2, float* o_part, float* ref_part,
                                                                float* sum_part) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t sq = ptx::smem_addr(base), skv = sq + kQBytes;  // stage s: K at skv + 2s KV, V after it
  auto& bars = *reinterpret_cast<Barriers*>(base + kQBytes + 2 * kStages * kKVBytes);
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(ptx::smem_addr(&bars.q_full), 1);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(ptx::smem_addr(&bars.k_full[s]), 1);
      ptx::mbarrier_init(ptx::smem_addr(&bars.v_full[s]), 1);
      ptx::mbarrier_init(ptx::smem_addr(&bars.k_empty[s]), 2);  // as the forward's: one per consumer warpgroup
      ptx::mbarrier_init(ptx::smem_addr(&bars.v_empty[s]), 2);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  const int n_tiles = (n_keys + kN - 1) / kN;
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::release_registers<40>();
    if (threadIdx.x == 0) {
      load_rows(sq, &tm_q, ptx::smem_addr(&bars.q_full), 0, kM);
      for (int it = 0; it < n_tiles; ++it) {
        const int stage = it % kStages;
        const uint32_t phase = (it / kStages) & 1;
        const uint32_t k_at = skv + 2 * stage * kKVBytes, v_at = k_at + kKVBytes;
        ptx::mbarrier_wait(ptx::smem_addr(&bars.k_empty[stage]), phase ^ 1);
        load_rows(k_at, &tm_k, ptx::smem_addr(&bars.k_full[stage]), it * kN, kN);
        ptx::mbarrier_wait(ptx::smem_addr(&bars.v_empty[stage]), phase ^ 1);
        load_rows(v_at, &tm_v, ptx::smem_addr(&bars.v_full[stage]), it * kN, kN);
      }
    }
    return;
  }
  ptx::acquire_registers<232>();
  const int w = warpgroup - 1;
  const FragmentCoords f(threadIdx.x % 128);
  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  OnlineSoftmax softmax(0.f, 8.f);
  ptx::mbarrier_wait(ptx::smem_addr(&bars.q_full), 0);
  for (int it = w; it < n_tiles; it += 2) {  // this warpgroup's ordinals
    const int stage = it % kStages;
    const uint32_t phase = (it / kStages) & 1;
    const uint32_t k_at = skv + 2 * stage * kKVBytes, v_at = k_at + kKVBytes;
    float s[kN / 2];
    ptx::mbarrier_wait(ptx::smem_addr(&bars.k_full[stage]), phase);
    issue_rows_gemm<__nv_bfloat16, kD / 64, kM, kN, kPanelBytes>(s, sq, k_at);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(s);
    if (threadIdx.x % 128 == 0) arrive_count(ptx::smem_addr(&bars.k_empty[stage]), 2);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          if (it * kN + f.col(j, c) >= n_keys) s[4 * j + 2 * r + c] = -INFINITY;
    float alpha[2];
    if (it == w) {
      softmax.step<true>(s, alpha, scale_log2);
    } else {
      softmax.step<false>(s, alpha, scale_log2);
      rescale_rows(o, alpha);
    }
    uint32_t p[kN / 16][4];
    accumulator_to_operand<__nv_bfloat16, kN>(s, p);
    ptx::mbarrier_wait(ptx::smem_addr(&bars.v_full[stage]), phase);
    ptx::pin(o);
    ptx::pin(p);
    ptx::wgmma_fence();
    issue_register_gemm<__nv_bfloat16, kD, kN / 16, kN * kPanelBytes>(o, p, v_at);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(o);
    if (threadIdx.x % 128 == 0) arrive_count(ptx::smem_addr(&bars.v_empty[stage]), 2);
  }
  // The partial state: O unnormalised, each row's reference (log2 units) and its whole sum.
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) o_part[(w * kM + f.row(r)) * kD + f.col(j, c)] = o[4 * j + 2 * r + c];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(softmax.row_sum[r]);
    if (threadIdx.x % 4 == 0) ref_part[w * kM + f.row(r)] = softmax.row_max[r], sum_part[w * kM + f.row(r)] = sum;
  }
}

int main() {
  const int n_keys = 1100;  // 9 tiles of 128, the last of 76 keys
  std::mt19937 rng(2028);
  std::vector<__nv_bfloat16> hq, hk, hv;
  std::vector<double> q, k, v;
  normal_bf16(rng, kM * kD, hq, q);
  normal_bf16(rng, size_t(n_keys) * kD, hk, k);
  normal_bf16(rng, size_t(n_keys) * kD, hv, v);
  const double scale = 1.0 / std::sqrt(double(kD));
  __nv_bfloat16 *dq, *dk, *dv;
  float *d_o, *d_ref, *d_sum;
  cudaMalloc(&dq, hq.size() * 2);
  cudaMalloc(&dk, hk.size() * 2);
  cudaMalloc(&dv, hv.size() * 2);
  cudaMalloc(&d_o, 2 * kM * kD * 4);
  cudaMalloc(&d_ref, 2 * kM * 4);
  cudaMalloc(&d_sum, 2 * kM * 4);
  cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(d_o, 0xFF, 2 * kM * kD * 4);  // NaN poison
  cudaMemset(d_ref, 0xFF, 2 * kM * 4);
  cudaMemset(d_sum, 0xFF, 2 * kM * 4);
  const CUtensorMap tq = bf16_panel_map(dq, kD, kM, kM), tk = bf16_panel_map(dk, kD, n_keys, kN),
                    tv = bf16_panel_map(dv, kD, n_keys, kN);
  cudaFuncSetAttribute(alternating_key_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  alternating_key_tiles<<<1, 384, kSmem>>>(tq, tk, tv, n_keys, static_cast<float>(scale * M_LOG2E), d_o, d_ref, d_sum);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::printf("FAIL: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::vector<float> o(2 * kM * kD), ref(2 * kM), sum(2 * kM);
  cudaMemcpy(o.data(), d_o, o.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(ref.data(), d_ref, ref.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(sum.data(), d_sum, sum.size() * 4, cudaMemcpyDeviceToHost);

  // The merge (PartialState::add_to's, in double), then O against fp64; each partial's own
  // attention over its tiles against fp64 too, so that a wrong tile split cannot hide in the sum.
  double num = 0, den = 0, part_num = 0, part_den = 0;
  bool finite = true;
  std::vector<double> scores(n_keys);
  for (int i = 0; i < kM; ++i) {
    double m = -INFINITY;
    for (int j = 0; j < n_keys; ++j) {
      double acc = 0;
      for (int c = 0; c < kD; ++c) acc += q[i * kD + c] * k[j * kD + c];
      scores[j] = acc * scale;
      m = std::fmax(m, scores[j]);
    }
    const double r_max = std::fmax(ref[i], ref[kM + i]);
    const double w0 = std::exp2(ref[i] - r_max), w1 = std::exp2(ref[kM + i] - r_max);
    const double l = sum[i] * w0 + sum[kM + i] * w1;
    finite = finite && std::isfinite(l) && l > 0 && sum[kM + i] > 0;
    for (int c = 0; c < kD; ++c) {
      double want = 0, total = 0, want_w[2] = {0, 0}, total_w[2] = {0, 0};
      for (int j = 0; j < n_keys; ++j) {
        const double e = std::exp(scores[j] - m);
        want += e * v[j * kD + c];
        total += e;
        want_w[(j / kN) % 2] += e * v[j * kD + c];
        total_w[(j / kN) % 2] += e;
      }
      want /= total;
      const double got = (o[i * kD + c] * w0 + o[(kM + i) * kD + c] * w1) / l;
      finite = finite && std::isfinite(got);
      num += (got - want) * (got - want);
      den += want * want;
      for (int g = 0; g < 2; ++g) {
        const double part = o[(g * kM + i) * kD + c] / sum[g * kM + i], part_want = want_w[g] / total_w[g];
        part_num += (part - part_want) * (part - part_want);
        part_den += part_want * part_want;
      }
    }
  }
  const double rel_l2 = std::sqrt(num / den), part_rel_l2 = std::sqrt(part_num / part_den);
  const bool ok = finite && rel_l2 < 1e-2 && part_rel_l2 < 1e-2;
  std::printf("merged O: rel L2 against fp64 %.3e; each warpgroup's own tiles: %.3e%s\n", rel_l2, part_rel_l2,
              finite ? "" : " (non-finite or empty partial states)");
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
