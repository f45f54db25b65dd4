// Build and run on the H200 (from the repository root; the helpers come from ../shared/probes,
// which must be copied into the tree first, e.g. into a git-ignored .probe/):
//   nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -I.probe -Iinclude -Isrc \
//        -o p_sw64b tools/probes/p_sw64b.cu && ./p_sw64b
// Result (session 3, run 31): exact for all three heads, both warpgroups. A 2-D variant
// (run 30) tried other descriptors: only layout type 2 (64-byte swizzle) with SBO 512 and
// +32 B per k32 step is exact.
// As the FP8 d=64 kernel: Q tile 128 x 64 B and K tile 128 x 64 B through 5-D maps
// {64, seqlen, 1, heads, batch} with SWIZZLE_64B; S = Q_wg K^T by m64n128k32 x2 for wg 0 and 1.
#include "tile_setup.cuh"
#include <cuda_fp8.h>
#include "wgmma_ops.cuh"
#include "hopper/ptx/wgmma_ops.cuh"
constexpr uint64_t WAIT_NS = 200000000ull;
__device__ __forceinline__ uint64_t desc64(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(16 >> 4) << 16) | ((uint64_t)(512 >> 4) << 32) | (2ull << 62);
}
__device__ __forceinline__ void tma5(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar) : "memory");
}
__global__ void k(const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mK, float* S, int* status, int head) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t base = init_barrier_and_tile_base(smem_raw, &bar);
  const uint32_t sQ = base, sK = base + 8192;
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(smem_u32(&bar), 16384);
    tma5(sQ, &mQ, smem_u32(&bar), 0, 0, 0, head, 0);
    tma5(sK, &mK, smem_u32(&bar), 0, 0, 0, head, 0);
  }
  const int ok = __syncthreads_and((int)mbar_wait_bounded(smem_u32(&bar), 0, WAIT_NS));
  if (!ok) { if (threadIdx.x == 0) *status = 2; return; }
  const int wg = threadIdx.x / 128;
  float d[64];
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
  pin(d);
  wgmma_fence();
  for (int kk = 0; kk < 2; ++kk)
    warpattn::ptx::WgmmaSS<__nv_fp8_e4m3, 128>::mma(d, desc64(sQ + wg * 4096 + 32 * kk), desc64(sK + 32 * kk), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  pin(d);
  const int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int j = 0; j < 16; ++j)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) S[(64 * wg + 16 * w + g + 8 * r) * 128 + 8 * j + 2 * q + c] = d[4 * j + 2 * r + c];
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
  g_probe = "sw64b";
  CK(cudaFree(0));
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 20480));
  const int H = 3, S = 128, D = 64;
  Lcg rng(7);
  std::vector<float> Q(S * H * D), K(S * H * D);
  for (auto& x : Q) x = (float)rng.small(-2, 2);
  for (auto& x : K) x = (float)rng.small(-2, 2);
  std::vector<uint8_t> Q8(Q.size()), K8(K.size());
  for (size_t i = 0; i < Q.size(); ++i) { Q8[i] = e4m3(Q[i]); K8[i] = e4m3(K[i]); }
  uint8_t *dQ, *dK; float* dS; int* dst;
  CK(cudaMalloc(&dQ, Q8.size())); CK(cudaMalloc(&dK, K8.size())); CK(cudaMalloc(&dS, 128 * 128 * 4)); CK(cudaMalloc(&dst, 4));
  CK(cudaMemcpy(dQ, Q8.data(), Q8.size(), cudaMemcpyHostToDevice)); CK(cudaMemcpy(dK, K8.data(), K8.size(), cudaMemcpyHostToDevice));
  CUtensorMap mQ, mK;
  for (auto [m, p] : {std::pair{&mQ, dQ}, std::pair{&mK, dK}}) {
    cuuint64_t dims[5] = {64, (cuuint64_t)S, 1, (cuuint64_t)H, 1};
    cuuint64_t strides[4] = {(cuuint64_t)H * D, 64, (cuuint64_t)D, (cuuint64_t)S * H * D};
    cuuint32_t box[5] = {64, 128, 1, 1, 1}, es[5] = {1, 1, 1, 1, 1};
    CUresult r = get_encode()(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 5, p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("PROBE sw64b: encode failed %d FAIL\n", (int)r); return 1; }
  }
  for (int head = 0; head < H; ++head) {
    CK(cudaMemset(dS, 0xff, 128 * 128 * 4)); CK(cudaMemset(dst, 0, 4));
    k<<<1, 256, 20480>>>(mQ, mK, dS, dst, head);
    CK(cudaDeviceSynchronize());
    std::vector<float> h(128 * 128); int st = 0;
    CK(cudaMemcpy(h.data(), dS, h.size() * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost));
    int bad = 0, first = -1;
    for (int m = 0; m < 128; ++m)
      for (int n = 0; n < 128; ++n) {
        double acc = 0;
        for (int kk = 0; kk < D; ++kk) acc += (double)Q[(m * H + head) * D + kk] * K[(n * H + head) * D + kk];
        if (!(h[m * 128 + n] == (float)acc)) { ++bad; if (first < 0) first = m * 128 + n; }
      }
    printf("PROBE sw64b: head %d: status %d, %d of 16384 differ%s", head, st, bad, bad ? "" : " PASS");
    if (first >= 0) printf(" (first row %d col %d got %g)", first / 128, first % 128, h[first]);
    printf("\n");
  }
  return 0;
}
