// How good is tanh.approx.f32 (MUFU.TANH) on the card, beside softcap.cuh's precise form
// 1 - 2 / (2^(2 log2(e) x) + 1)? Softcap's speed gap to FlashAttention-3 (run 129: 0.72-0.80)
// is that one MUFU op against our two; whether the approximation is good enough is the
// question this answers first, before the A/B of WARPATTN_TUNE_SOFTCAP_TANH.
// Sweeps 2^26 evenly spaced x in [-12, 12] plus every fourth float in [2^-12, 2) (the small scores
// most logits are), and prints each form's largest absolute and relative error against
// double-precision tanh, and the largest logit error softcap * |err| at caps 30 and 50.
// Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -o p_tanh tools/probes/p_tanh_approx.cu && ./p_tanh
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

__global__ void both_forms(const float* x, float* approx, float* precise, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    float t, e, r;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(v));
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * 2.8853900817779268f));  // 2 log2(e)
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.f));
    approx[i] = t;
    precise[i] = fmaf(-2.f, r, 1.f);
  }
}

struct Worst {
  double abs = 0, rel = 0, abs_at = 0, rel_at = 0;
  void add(double x, double got, double want) {
    const double a = std::fabs(got - want);
    if (!(a <= abs)) abs = a, abs_at = x;  // NaN counts as worst
    const double r = want != 0 ? a / std::fabs(want) : a;
    if (!(r <= rel)) rel = r, rel_at = x;
  }
};

int main() {
  std::vector<float> x;
  const int64_t grid = int64_t{1} << 26;
  for (int64_t i = 0; i < grid; ++i) x.push_back(static_cast<float>(-12.0 + 24.0 * i / (grid - 1)));
  uint32_t lo, hi;
  const float a = 0x1p-12f, b = 2.f;
  std::memcpy(&lo, &a, 4);
  std::memcpy(&hi, &b, 4);
  for (uint32_t u = lo; u < hi; u += 4) {  // every fourth float (27M of them)
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
    x.push_back(-f);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  float *dx, *dt, *dp;
  cudaMalloc(&dx, n * 4);
  cudaMalloc(&dt, n * 4);
  cudaMalloc(&dp, n * 4);
  cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
  both_forms<<<1024, 256>>>(dx, dt, dp, n);
  std::vector<float> t(n), p(n);
  cudaMemcpy(t.data(), dt, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(p.data(), dp, n * 4, cudaMemcpyDeviceToHost);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  Worst wt, wp, wt_small, wp_small;
  for (int64_t i = 0; i < n; ++i) {
    const double want = std::tanh(static_cast<double>(x[i]));
    wt.add(x[i], t[i], want);
    wp.add(x[i], p[i], want);
    if (std::fabs(x[i]) < 0.5f) {
      wt_small.add(x[i], t[i], want);
      wp_small.add(x[i], p[i], want);
    }
  }
  std::printf("%lld inputs\n", static_cast<long long>(n));
  const auto line = [](const char* name, const Worst& w) {
    std::printf("%-34s max abs %.3e (x = %.6g)  max rel %.3e (x = %.6g)  logit error at cap 30: %.2e, 50: %.2e\n",
                name, w.abs, w.abs_at, w.rel, w.rel_at, 30 * w.abs, 50 * w.abs);
  };
  line("tanh.approx.f32", wt);
  line("1 - 2 rcp(ex2 + 1) (ours)", wp);
  line("tanh.approx.f32, |x| < 0.5", wt_small);
  line("1 - 2 rcp(ex2 + 1), |x| < 0.5", wp_small);
  return 0;
}
