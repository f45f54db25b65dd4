// The few-row decode tile (docs/decode-design.md, "The few-row tile") for an E4M3 KV cache,
// before any kernel: one CTA, two consumer warpgroups over the same kRows packed query rows, each
// taking 64 of every 128-key tile, with the cache's own shared-memory layouts:
//   Sᵀ (64 keys x kRows) = K·Qᵀ      SS wgmma m64nNk32 e4m3, A = K rows, B = Q codes, both
//                                     K-major in 128-byte swizzled rows (d = 128: one panel);
//   Oᵀ (d x kRows) += Vᵀ·Pᵀ          SS wgmma m64nNk32 e4m3, A = the Vᵀ slices as the cache
//                                     keeps them (fp8_cache_layout.hpp: 16-key slices of d rows
//                                     x 16 B, no swizzle, keys in kFp8KeyOrder), B = Pᵀ written
//                                     in the same slices and the same key order: FP8 wgmma has
//                                     no transpose, so A must be K-major and it is;
//   Pᵀ's bytes: warp w's 16 keys are slice w; a thread holds keys g and g + 8 of its warp for
//   its kRows / 4 columns, which kFp8KeyOrder puts in word g / 2 of the row's 16 bytes (bytes
//   g % 2 and 2 + g % 2): one e4m3x4 pack, one shuffle with lane ^ 4 and one 32-bit store per 8
//   columns (no stmatrix: it moves 16-bit elements).
// P is lifted by 2^kPLog2Offset as the FP8 kernels lift it (forward_config.hpp).
// Checked: O of kRows rows against fp64 over the dequantised data, beside the wide form's (the
// E4M3 KV-cache kernel's today: one warpgroup, 64 rows x 128 keys, S = Q·Kᵀ, P in registers in
// kFp8KeyOrder, O += P·Vᵀ), whose error is the bar (the few-row form rounds the same P values,
// against another running max). Timed (clock64, data in shared memory, the consumers' own cost a
// key tile): both forms, unpipelined, and the few-row one pipelined. On the GPU host:
//   nvcc -std=c++20 -O2 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a -o p_few_rows_e4m3 tools/probes/p_decode_few_rows_e4m3.cu && ./p_few_rows_e4m3
// (-DPROBE_ROWS=16: m64n16k32.)
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "hopper/consumer_gemms.cuh"
#include "hopper/decode/fp8_cache_layout.hpp"
#include "hopper/fragment.cuh"
#include "hopper/ptx/math.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/transposed_rows.cuh"

using namespace warpattn;
using namespace warpattn::detail;
using Code = __nv_fp8_e4m3;

#ifndef PROBE_ROWS
#define PROBE_ROWS 32
#endif
constexpr int kD = 128, kBlockN = 128, kRows = PROBE_ROWS, kTiles = 4, kRowBytes = 128;
constexpr float kPLog2Offset = 6.f;  // WARPATTN_TUNE_FP8_P_LIFT's default
constexpr int kTileBytes = kBlockN * kD;  // 16 KB: a K or Vᵀ tile
constexpr int kSliceBytes = kD * 16;      // a Vᵀ slice: 16 keys x d rows of 16 B
constexpr int kQBytes = 64 * kD;
constexpr int kPtSliceBytes = kRows * 16;    // a Pᵀ slice: 16 keys x kRows rows of 16 B
constexpr int kPtBytes = 4 * kPtSliceBytes;  // a warpgroup's Pᵀ: its 64 keys
constexpr int kSmem = kQBytes + 2 * kTiles * kTileBytes + 2 * kPtBytes + 2 * 4 * kRows * 4 + 2 * kD * kRows * 4 +
                      4 * kRows * 4 + 1024;

// The wide form's GEMM helpers read these (consumer_gemms.cuh: the E4M3 cache's P·V).
struct WideCfg {
  using Element = Code;
  static constexpr bool kFp8 = true, kVtSlices = true;
  static constexpr int kBlockN = ::kBlockN, kHeadDim = kD, kOCols = kD, kPvSteps = kBlockN / 32;
};

// Row r, byte c of a K-major tile of 128-byte swizzled rows (d = 128 e4m3: one panel).
__host__ __device__ inline int swizzled_offset(int r, int c) { return r * kRowBytes + (((c / 16) ^ (r % 8)) * 16) + c % 16; }

struct Smem {
  uint8_t *q, *k, *v, *pt;
  float *xmax, *merge_o, *merge_m, *merge_l;
};
__device__ Smem carve(uint8_t* raw) {
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  Smem s;
  s.q = base;
  s.k = s.q + kQBytes;
  s.v = s.k + kTiles * kTileBytes;
  s.pt = s.v + kTiles * kTileBytes;
  s.xmax = reinterpret_cast<float*>(s.pt + 2 * kPtBytes);
  s.merge_o = s.xmax + 2 * 4 * kRows;
  s.merge_m = s.merge_o + 2 * kD * kRows;
  s.merge_l = s.merge_m + 2 * kRows;
  return s;
}

// Q (64 rows), K and V (kTiles x kBlockN x kD codes) into the kernels' layouts: Q and K swizzled
// rows, V as each tile's Vᵀ slices (fp8_vt_byte_in_slice).
__device__ void load_tiles(const Smem& s, const uint8_t* q, const uint8_t* k, const uint8_t* v) {
  for (int i = threadIdx.x; i < 64 * kD; i += blockDim.x) s.q[swizzled_offset(i / kD, i % kD)] = q[i];
  for (int i = threadIdx.x; i < kTiles * kBlockN * kD; i += blockDim.x) {
    const int t = i / (kBlockN * kD), key = i / kD % kBlockN, c = i % kD;
    s.k[t * kTileBytes + swizzled_offset(key, c)] = k[i];
    s.v[t * kTileBytes + key / 16 * kSliceBytes + fp8_vt_byte_in_slice(key % 16, c)] = v[i];
  }
  ptx::fence_proxy_async_shared();
  __syncthreads();
}

template <bool kPipelined>
__global__ void __launch_bounds__(256) few_rows(const uint8_t* q, const uint8_t* k, const uint8_t* v, float scale_log2,
                                              int passes, float* o_out, long long* cycles) {
  extern __shared__ uint8_t smem_raw[];
  const Smem s = carve(smem_raw);
  load_tiles(s, q, k, v);
  const int wg = threadIdx.x / 128;
  const FragmentCoords f(threadIdx.x % 128);
  uint8_t* pt = s.pt + wg * kPtBytes;
  const uint32_t q_addr = ptx::smem_addr(s.q), pt_addr = ptx::smem_addr(pt);

  float o[2][kRows / 2];
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) o[mb][i] = 0.f;
  float m[kRows / 8][2], l[kRows / 8][2];
#pragma unroll
  for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) m[j][c] = -INFINITY, l[j][c] = 0.f;
  float st[kRows / 2], pr[kRows / 2], alpha[kRows / 8][2];

  auto issue_st = [&](int it) {
    const uint32_t k_rows = ptx::smem_addr(s.k + it % kTiles * kTileBytes) + wg * 64 * kRowBytes;
    issue_rows_gemm<Code, 1, kBlockN, kRows, kRowBytes>(st, k_rows, q_addr);
    ptx::wgmma_commit();
  };
  auto softmax_local = [&]() {
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float x = column_max(fmaxf(st[4 * j + c], st[4 * j + 2 + c]));
        if (f.group == 0) s.xmax[(wg * 4 + f.warp) * kRows + f.col(j, c)] = x;
      }
  };
  auto softmax_finish = [&]() {
    ptx::named_barrier_sync(1 + wg, 128);
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float x = s.xmax[(wg * 4) * kRows + f.col(j, c)];
#pragma unroll
        for (int w = 1; w < 4; ++w) x = fmaxf(x, s.xmax[(wg * 4 + w) * kRows + f.col(j, c)]);
        const float m_new = fmaxf(m[j][c], x * scale_log2);
        alpha[j][c] = ptx::exp2_approx(m[j][c] - m_new);
        m[j][c] = m_new;
        const float p0 = ptx::exp2_approx(st[4 * j + c] * scale_log2 - m_new + kPLog2Offset);
        const float p1 = ptx::exp2_approx(st[4 * j + 2 + c] * scale_log2 - m_new + kPLog2Offset);
        pr[4 * j + c] = p0, pr[4 * j + 2 + c] = p1;
        l[j][c] = l[j][c] * alpha[j][c] + p0 + p1;
      }
  };
  auto rescale_and_store = [&]() {
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int mb = 0; mb < 2; ++mb) o[mb][4 * j + c] *= alpha[j][c], o[mb][4 * j + 2 + c] *= alpha[j][c];
    store_transposed_rows_e4m3<kRows>(pt, f, pr);
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(1 + wg, 128);
  };
  // Oᵀ += Vᵀ·Pᵀ: A = the warpgroup's 4 slices of the Vᵀ tile (rows 64 mb ..: 1024 B further), B =
  // its Pᵀ; LBO between a k32 step's two core matrices along K (one slice), SBO between 8-row
  // groups (128 B); each k32 step two slices further.
  auto issue_ot = [&](int it) {
    const uint32_t vt = ptx::smem_addr(s.v + it % kTiles * kTileBytes) + 4 * wg * kSliceBytes;
    const uint64_t bd = ptx::make_plain_smem_desc(pt_addr, kPtSliceBytes, 128);
    ptx::pin(o[0]);
    ptx::pin(o[1]);
    ptx::wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) {
      const uint64_t ad = ptx::make_plain_smem_desc(vt + mb * 64 * 16, kSliceBytes, 128);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        ptx::WgmmaSS<Code, kRows>::mma(o[mb], advance(ad, kk * 2 * kSliceBytes), advance(bd, kk * 2 * kPtSliceBytes),
                                       1);
    }
    ptx::wgmma_commit();
  };

  const int n = passes * kTiles;
  const long long t0 = clock64();
  if constexpr (!kPipelined) {
    for (int it = 0; it < n; ++it) {
      issue_st(it);
      ptx::wgmma_wait<0>();
      ptx::pin(st);
      softmax_local();
      softmax_finish();
      rescale_and_store();
      issue_ot(it);
      ptx::wgmma_wait<0>();
      ptx::pin(o[0]);
      ptx::pin(o[1]);
    }
  } else {
    issue_st(0);
    ptx::wgmma_wait<0>();
    ptx::pin(st);
    softmax_local();
    softmax_finish();
    rescale_and_store();
    for (int it = 0; it < n; ++it) {
      if (it + 1 < n) {
        ptx::pin(st);
        issue_st(it + 1);
      }
      issue_ot(it);
      if (it + 1 < n) {
        ptx::wgmma_wait<1>();
        ptx::pin(st);
        softmax_local();
        ptx::wgmma_wait<0>();
        ptx::pin(o[0]);
        ptx::pin(o[1]);
        softmax_finish();
        rescale_and_store();
      } else {
        ptx::wgmma_wait<0>();
        ptx::pin(o[0]);
        ptx::pin(o[1]);
      }
    }
  }
  const long long t1 = clock64();
  if (threadIdx.x % 128 == 0) cycles[wg] = t1 - t0;

#pragma unroll
  for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float x = column_sum(l[j][c]);
      if (f.group == 0) s.xmax[(wg * 4 + f.warp) * kRows + f.col(j, c)] = x;
      if (threadIdx.x % 128 < 4) s.merge_m[wg * kRows + f.col(j, c)] = m[j][c];
    }
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          s.merge_o[(wg * kD + 64 * mb + f.row(r)) * kRows + f.col(j, c)] = o[mb][4 * j + 2 * r + c];
  __syncthreads();
  for (int i = threadIdx.x; i < kRows * kD; i += blockDim.x) {
    const int row = i / kD, d = i % kD;
    float mw[2], lw[2];
    for (int w = 0; w < 2; ++w) {
      mw[w] = s.merge_m[w * kRows + row];
      lw[w] = 0.f;
      for (int x = 0; x < 4; ++x) lw[w] += s.xmax[(w * 4 + x) * kRows + row];
    }
    const float mx = fmaxf(mw[0], mw[1]);
    const float a0 = exp2f(mw[0] - mx), a1 = exp2f(mw[1] - mx);
    o_out[i] = (s.merge_o[(0 * kD + d) * kRows + row] * a0 + s.merge_o[(1 * kD + d) * kRows + row] * a1) /
               (lw[0] * a0 + lw[1] * a1);
  }
}

// The wide form (the E4M3 KV-cache kernel's today, unpipelined): warpgroup 0 alone, 64 rows x
// 128 keys a tile, P packed in kFp8KeyOrder from registers (convert_to_operand) against the Vᵀ
// slices (issue_pv_gemm); warpgroup 1 idle. O of the first kRows rows into o_out.
__global__ void __launch_bounds__(256) wide(const uint8_t* q, const uint8_t* k, const uint8_t* v, float scale_log2,
                                            int passes, float* o_out, long long* cycles) {
  extern __shared__ uint8_t smem_raw[];
  const Smem s = carve(smem_raw);
  load_tiles(s, q, k, v);
  if (threadIdx.x >= 128) return;
  const FragmentCoords f(threadIdx.x);
  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const long long t0 = clock64();
  for (int it = 0; it < passes * kTiles; ++it) {
    const int tile = it % kTiles;
    float st[kBlockN / 2];
    issue_rows_gemm<Code, 1, 64, kBlockN, kRowBytes>(st, ptx::smem_addr(s.q), ptx::smem_addr(s.k + tile * kTileBytes));
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(st);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) x = fmaxf(x, fmaxf(st[4 * j + 2 * r], st[4 * j + 2 * r + 1]));
      const float m_new = fmaxf(m[r], quad_max(x) * scale_log2);
      const float alpha = ptx::exp2_approx(m[r] - m_new);
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& y = st[4 * j + 2 * r + c];
          y = ptx::exp2_approx(y * scale_log2 - m_new + kPLog2Offset);
          sum += y;
        }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) o[4 * j + 2 * r] *= alpha, o[4 * j + 2 * r + 1] *= alpha;
    }
    uint32_t p[WideCfg::kPvSteps][4];
    convert_to_operand<WideCfg>(st, p);
    ptx::pin(o);
    ptx::pin(p);
    issue_pv_gemm<WideCfg>(o, p, ptx::smem_addr(s.v + tile * kTileBytes));
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(o);
  }
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[0] = t1 - t0;
  const float inv[2] = {1.f / quad_sum(l[0]), 1.f / quad_sum(l[1])};
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        if (f.row(r) < kRows) o_out[f.row(r) * kD + f.col(j, c)] = o[4 * j + 2 * r + c] * inv[r];
}

int main() {
  std::mt19937 rng(20261207);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int keys = kTiles * kBlockN;
  std::vector<uint8_t> hq(64 * kD), hk(keys * kD), hv(keys * kD);
  std::vector<double> q(64 * kD), k(keys * kD), v(keys * kD);
  auto code = [](float x, double& back) {
    const __nv_fp8_e4m3 c(x);
    back = static_cast<float>(c);
    return static_cast<uint8_t>(c.__x);
  };
  for (int i = 0; i < 64 * kD; ++i) hq[i] = code(normal(rng), q[i]);
  for (int i = 0; i < keys * kD; ++i) {
    hk[i] = code(normal(rng) * (1.f + 0.5f * ((i / kD) % 7)), k[i]);  // keys of several scales
    hv[i] = code(normal(rng), v[i]);
  }
  const double scale = 1.0 / std::sqrt(double(kD));
  uint8_t *dq, *dk, *dv;
  float* dout;
  long long* dcycles;
  cudaMalloc(&dq, hq.size());
  cudaMalloc(&dk, hk.size());
  cudaMalloc(&dv, hv.size());
  cudaMalloc(&dout, kRows * kD * 4);
  cudaMalloc(&dcycles, 2 * sizeof(long long));
  cudaMemcpy(dq, hq.data(), hq.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dk, hk.data(), hk.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dv, hv.data(), hv.size(), cudaMemcpyHostToDevice);
  cudaFuncSetAttribute(few_rows<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaFuncSetAttribute(few_rows<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaFuncSetAttribute(wide, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  const float scale_log2 = static_cast<float>(scale * M_LOG2E);
  std::vector<double> ref(kRows * kD);
  for (int i = 0; i < kRows; ++i) {
    std::vector<double> sc(keys);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < keys; ++j) {
      double acc = 0;
      for (int c = 0; c < kD; ++c) acc += q[i * kD + c] * k[j * kD + c];
      mx = std::fmax(mx, sc[j] = acc * scale);
    }
    for (int j = 0; j < keys; ++j) sum += sc[j] = std::exp(sc[j] - mx);
    for (int c = 0; c < kD; ++c) {
      double acc = 0;
      for (int j = 0; j < keys; ++j) acc += sc[j] * v[j * kD + c];
      ref[i * kD + c] = acc / sum;
    }
  }
  // form 0: wide, 1: few-row, 2: few-row pipelined; the bar: the wide form's error (x 1.25).
  const char* names[3] = {"wide (1 warpgroup, 64 rows x 128 keys)", "few_rows (2 warpgroups x 64 keys)",
                          "few_rows pipelined"};
  auto launch = [&](int form, int passes) {
    if (form == 0) wide<<<1, 256, kSmem>>>(dq, dk, dv, scale_log2, passes, dout, dcycles);
    else if (form == 1) few_rows<false><<<1, 256, kSmem>>>(dq, dk, dv, scale_log2, passes, dout, dcycles);
    else few_rows<true><<<1, 256, kSmem>>>(dq, dk, dv, scale_log2, passes, dout, dcycles);
    return cudaDeviceSynchronize();
  };
  bool ok = true;
  double wide_error = 0;
  for (int form = 0; form < 3; ++form) {
    cudaMemset(dout, 0xFF, kRows * kD * 4);  // NaN poison
    if (cudaError_t e = launch(form, 1); e != cudaSuccess) {
      std::printf("FAIL: %s: %s\n", names[form], cudaGetErrorString(e));
      return 1;
    }
    std::vector<float> o(kRows * kD);
    cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost);
    double num = 0, den = 0;
    bool finite = true;
    for (int i = 0; i < kRows * kD; ++i) {
      finite = finite && std::isfinite(o[i]);
      num += (o[i] - ref[i]) * (o[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    const double rel_l2 = std::sqrt(num / den);
    if (form == 0) wide_error = rel_l2;
    const bool pass = finite && rel_l2 < 0.1 && (form == 0 || rel_l2 <= 1.25 * wide_error + 1e-3);
    ok = ok && pass;
    std::printf("%s O (%d rows, %d keys): rel L2 against fp64 %.3e%s%s\n", names[form], kRows, keys, rel_l2,
                finite ? "" : " (non-finite values)", pass ? "" : " FAIL");
  }
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const int passes = 64;
  long long cyc[2];
  for (int form = 0; form < 3; ++form) {
    for (int rep = 0; rep < 2; ++rep)
      if (cudaError_t e = launch(form, passes); e != cudaSuccess) {
        std::printf("FAIL: %s\n", cudaGetErrorString(e));
        return 1;
      }
    cudaMemcpy(cyc, dcycles, sizeof(cyc), cudaMemcpyDeviceToHost);
    const double per_tile = double(cyc[0]) / (passes * kTiles);
    std::printf("%s: %.0f cycles a 128-key tile (%.3f us at the %d MHz clock attribute)\n", names[form], per_tile,
                per_tile / (clock_khz * 1e-3), clock_khz / 1000);
  }
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
