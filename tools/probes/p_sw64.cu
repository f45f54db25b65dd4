// Build and run as tools/probes/p_sw64b.cu. Result (session 3, run 30): only layout type 2
// with SBO 512 and +32 B per k32 step is exact.
// FP8 e4m3 wgmma SS with 64-byte rows (d = 64): A (64 x 64) and B (64 x 64) K-major, TMA
// SWIZZLE_64B, two k32 steps (+32 B). Which descriptor (layout type, SBO) reads them right?
#include "common.cuh"
#include "wgmma_ops.cuh"
constexpr uint64_t WAIT_NS = 200000000ull;
__device__ __forceinline__ uint64_t desc_any(uint32_t addr, uint32_t lbo, uint32_t sbo, uint64_t layout) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (layout << 62);
}
__global__ void k(const __grid_constant__ CUtensorMap mA, const __grid_constant__ CUtensorMap mB, float* D, int* status,
                  int sbo, int layout, int step) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t raw = smem_u32(smem_raw);
  if (threadIdx.x == 0) { mbar_init(smem_u32(&bar), 1); fence_barrier_init(); }
  __syncthreads();
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t sA = base, sB = base + 4096;
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(smem_u32(&bar), 8192);
    tma_load_2d(sA, &mA, smem_u32(&bar), 0, 0);
    tma_load_2d(sB, &mB, smem_u32(&bar), 0, 0);
  }
  const int ok = __syncthreads_and((int)mbar_wait_bounded(smem_u32(&bar), 0, WAIT_NS));
  if (!ok) { if (threadIdx.x == 0) *status = 2; return; }
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  pin(d);
  wgmma_fence();
  for (int kk = 0; kk < 2; ++kk)
    wgmma_ss_m64n64k32_e4m3(d, desc_any(sA + step * kk, 16, sbo, layout), desc_any(sB + step * kk, 16, sbo, layout), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  pin(d);
  const int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int j = 0; j < 8; ++j)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) D[(16 * w + g + 8 * r) * 64 + 8 * j + 2 * q + c] = d[4 * j + 2 * r + c];
  if (threadIdx.x == 0) *status = 1;
}
static uint8_t e4m3(float v) {
  if (v == 0) return 0;
  const uint8_t sgn = v < 0 ? 0x80 : 0;
  const float a = fabsf(v);
  const int e = (int)floorf(log2f(a));
  const int m = (int)lrintf((a / ldexpf(1.f, e) - 1.f) * 8.f);
  return sgn | (uint8_t)((e + 7) << 3) | (uint8_t)m;
}
int main() {
  g_probe = "sw64";
  CK(cudaFree(0));
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 16384));
  Lcg rng(5);
  std::vector<float> A(64 * 64), B(64 * 64);
  for (auto& x : A) x = (float)rng.small(-2, 2);
  for (auto& x : B) x = (float)rng.small(-2, 2);
  std::vector<uint8_t> A8(4096), B8(4096);
  for (int i = 0; i < 4096; ++i) { A8[i] = e4m3(A[i]); B8[i] = e4m3(B[i]); }
  uint8_t *dA, *dB; float* dD; int* dst;
  CK(cudaMalloc(&dA, 4096)); CK(cudaMalloc(&dB, 4096)); CK(cudaMalloc(&dD, 16384)); CK(cudaMalloc(&dst, 4));
  CK(cudaMemcpy(dA, A8.data(), 4096, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dB, B8.data(), 4096, cudaMemcpyHostToDevice));
  CUtensorMap mA, mB;
  for (auto [m, p] : {std::pair{&mA, dA}, std::pair{&mB, dB}}) {
    cuuint64_t dims[2] = {64, 64}, strides[1] = {64};
    cuuint32_t box[2] = {64, 64}, es[2] = {1, 1};
    CUresult r = get_encode()(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("PROBE sw64: encode failed %d FAIL\n", (int)r); return 1; }
  }
  std::vector<float> ref(4096);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n) {
      double acc = 0;
      for (int kk = 0; kk < 64; ++kk) acc += (double)A[m * 64 + kk] * B[n * 64 + kk];
      ref[m * 64 + n] = (float)acc;
    }
  struct V { int sbo, layout, step; } vs[] = {{512, 2, 32}, {1024, 2, 32}, {256, 2, 32}, {512, 1, 32}, {512, 2, 16}, {512, 3, 32}};
  for (auto v : vs) {
    CK(cudaMemset(dD, 0xff, 16384)); CK(cudaMemset(dst, 0, 4));
    k<<<1, 128, 16384>>>(mA, mB, dD, dst, v.sbo, v.layout, v.step);
    CK(cudaDeviceSynchronize());
    std::vector<float> h(4096); int st = 0;
    CK(cudaMemcpy(h.data(), dD, 16384, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost));
    int bad = 0, first = -1;
    for (int i = 0; i < 4096; ++i) if (!(h[i] == ref[i])) { ++bad; if (first < 0) first = i; }
    printf("PROBE sw64: layout %d SBO %d step %d: status %d, %d of 4096 differ%s", v.layout, v.sbo, v.step, st, bad, bad ? "" : " PASS");
    if (first >= 0) printf(" (first row %d col %d got %g want %g)", first / 64, first % 64, h[first], ref[first]);
    printf("\n");
  }
  return 0;
}
