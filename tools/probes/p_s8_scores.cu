// INT8 scores for the FP8 path (docs/perf/fp8-accuracy.md, "INT8 for Q and K"): the first
// verified piece before any kernel change. Q (64 x 128) and K (128 x 128) as s8, K-major
// 128B-swizzled tiles via TMA (UINT8 maps, the same layout as FP8 d = 128), S = Q K^T by
// wgmma m64n128k32.s32.s8.s8 x4, then each int32 score to float by the magic-number route the
// softmax would use (bits + 0x4B400000 read as float, minus 1.5 * 2^23). Checks the int32
// scores and the floats exactly against the CPU, with |q|, |k| <= 127 so that |s| reaches
// 128 * 127^2 (the d = 256 bound, 256 * 127^2, is below 2^22 too).
// Build and run on the H200 from the repository root, with ../shared/probes copied to .probe/:
//   nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -I.probe -o p_s8 tools/probes/p_s8_scores.cu && ./p_s8
#include "tile_setup.cuh"
#include "wgmma_ops.cuh"
constexpr uint64_t WAIT_NS = 200000000ull;

__device__ __forceinline__ void wgmma_s8_m64n128k32(int32_t (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, %64, %65, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}

// An int32 with |x| < 2^22 to float in two integer/float adds (exact).
__device__ __forceinline__ float int_to_float_magic(int32_t x) {
  return __int_as_float(x + 0x4B400000) - 12582912.f;
}

__global__ void k(const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mK, int32_t* S,
                  float* F, int* status) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t base = init_barrier_and_tile_base(smem_raw, &bar);
  const uint32_t sQ = base, sK = base + 8192;
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(smem_u32(&bar), 8192 + 16384);
    tma_load_2d(sQ, &mQ, smem_u32(&bar), 0, 0);
    tma_load_2d(sK, &mK, smem_u32(&bar), 0, 0);
  }
  const int ok = __syncthreads_and((int)mbar_wait_bounded(smem_u32(&bar), 0, WAIT_NS));
  if (!ok) { if (threadIdx.x == 0) *status = 2; return; }
  int32_t d[64];
  for (int i = 0; i < 64; ++i) d[i] = 0;
  wgmma_fence();
  for (int kk = 0; kk < 4; ++kk)
    wgmma_s8_m64n128k32(d, make_desc(sQ + 32 * kk, 16, 1024), make_desc(sK + 32 * kk, 16, 1024), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  const int t = threadIdx.x, w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int j = 0; j < 16; ++j)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) {
        const int i = (16 * w + g + 8 * r) * 128 + 8 * j + 2 * q + c;
        S[i] = d[4 * j + 2 * r + c];
        F[i] = int_to_float_magic(d[4 * j + 2 * r + c]);
      }
  if (threadIdx.x == 0) *status = 1;
}

int main() {
  g_probe = "s8_scores";
  CK(cudaFree(0));
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768));
  Lcg rng(3);
  std::vector<int8_t> Q(64 * 128), K(128 * 128);
  for (auto& x : Q) x = (int8_t)rng.small(-127, 127);
  for (auto& x : K) x = (int8_t)rng.small(-127, 127);
  for (int i = 0; i < 128; ++i) { Q[i] = 127; K[i] = 127; }          // row 0 . key 0 = 128 * 127^2
  for (int i = 0; i < 128; ++i) K[128 + i] = -127;                    // row 0 . key 1 = -128 * 127^2
  int8_t *dQ, *dK; int32_t* dS; float* dF; int* dst;
  CK(cudaMalloc(&dQ, Q.size())); CK(cudaMalloc(&dK, K.size()));
  CK(cudaMalloc(&dS, 64 * 128 * 4)); CK(cudaMalloc(&dF, 64 * 128 * 4)); CK(cudaMalloc(&dst, 4));
  CK(cudaMemcpy(dQ, Q.data(), Q.size(), cudaMemcpyHostToDevice)); CK(cudaMemcpy(dK, K.data(), K.size(), cudaMemcpyHostToDevice));
  CK(cudaMemset(dst, 0, 4));
  CUtensorMap mQ, mK;
  const auto encode_map = [](CUtensorMap* m, int8_t* p, int rows) {
    cuuint64_t dims[2] = {128, (cuuint64_t)rows}, strides[1] = {128};
    cuuint32_t box[2] = {128, (cuuint32_t)rows}, es[2] = {1, 1};
    CUresult r = get_encode()(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("PROBE s8_scores: encode failed %d FAIL\n", (int)r); exit(1); }
  };
  encode_map(&mQ, dQ, 64);
  encode_map(&mK, dK, 128);
  k<<<1, 128, 32768>>>(mQ, mK, dS, dF, dst);
  CK(cudaDeviceSynchronize());
  std::vector<int32_t> hS(64 * 128); std::vector<float> hF(64 * 128); int st = 0;
  CK(cudaMemcpy(hS.data(), dS, hS.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hF.data(), dF, hF.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost));
  int bad_s = 0, bad_f = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 128; ++n) {
      int64_t acc = 0;
      for (int kk = 0; kk < 128; ++kk) acc += (int64_t)Q[m * 128 + kk] * K[n * 128 + kk];
      bad_s += hS[m * 128 + n] != acc;
      bad_f += hF[m * 128 + n] != (float)acc;
    }
  printf("PROBE s8_scores: status %d; int32 scores differing %d of 8192, floats differing %d; s[0][0] = %d, s[0][1] = %d %s\n",
         st, bad_s, bad_f, hS[0], hS[1], (st == 1 && !bad_s && !bad_f) ? "PASS" : "FAIL");
  return 0;
}
