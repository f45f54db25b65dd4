// Host pieces the TMA probes share (p_split_head_dim_loop.cu, p_alternating_key_tiles.cu,
// p_tma_issue_rate.cu, p_vt_slices_rate.cu, p_kv_layout_rate.cu).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

// A row-major (rows, cols) bf16 tensor as the kernels' 5-D panel map: boxes of 64 columns x
// box_rows rows, 128B swizzle (one panel per box, as make_panel_tensor_map's).
inline CUtensorMap bf16_panel_map(const void* data, int cols, int rows, int box_rows) {
  CUtensorMap map;
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(cols) * 2;
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows), 1, 1, 1};
  const cuuint64_t strides[4] = {row_bytes, row_bytes * rows, row_bytes * rows, row_bytes * rows};
  const cuuint32_t box[5] = {64, static_cast<cuuint32_t>(box_rows), 1, 1, 1}, elements[5] = {1, 1, 1, 1, 1};
  const CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, const_cast<void*>(data), dims,
                                            strides, box, elements, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("FAIL: cuTensorMapEncodeTiled returned %d\n", static_cast<int>(r));
    std::exit(1);
  }
  return map;
}

// A tensor of `rank` <= 5 dims (innermost first, in elements; strides of dims 1 .. rank - 1 in
// bytes) as a 5-D map with boxes of box[0 .. rank - 1] (the dims past rank of size and box 1),
// L2 promotion 256B, no OOB fill. FAIL and exit if the driver refuses it.
inline CUtensorMap tiled_map(CUtensorMapDataType type, void* data, int rank, const cuuint64_t* dims,
                             const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  CUtensorMap map;
  cuuint64_t d5[5] = {1, 1, 1, 1, 1}, s4[4] = {0, 0, 0, 0};
  cuuint32_t b5[5] = {1, 1, 1, 1, 1}, e5[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < rank; ++i) d5[i] = dims[i], b5[i] = box[i];
  for (int i = 0; i < rank - 1; ++i) s4[i] = strides[i];
  // (the unit dims' strides: any multiple of 16 that keeps them past the last real one)
  for (int i = rank - 1; i < 4; ++i) s4[i] = (i == 0 ? d5[0] : s4[i - 1] * d5[i]);
  const CUresult r = cuTensorMapEncodeTiled(&map, type, 5, data, d5, s4, b5, e5, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("FAIL: cuTensorMapEncodeTiled returned %d\n", static_cast<int>(r));
    std::exit(1);
  }
  return map;
}

// The device copy rate (bytes read + written per second) of 5 copies of `bytes` from src to dst,
// after one untimed: the bar the stream probes report against.
inline double copy_rate(void* dst, const void* src, size_t bytes) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < 5; ++i) cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return 5.0 * 2 * bytes / (ms * 1e-3);
}

// n N(0, 1) values rounded to bf16, and the same values in double for the reference.
inline void normal_bf16(std::mt19937& rng, size_t n, std::vector<__nv_bfloat16>& bf16, std::vector<double>& exact) {
  std::normal_distribution<float> normal(0.f, 1.f);
  bf16.resize(n), exact.resize(n);
  for (size_t i = 0; i < n; ++i) exact[i] = __bfloat162float(bf16[i] = __float2bfloat16(normal(rng)));
}

// The fastest of reps - 1 timed runs of run() (after a first, untimed warm-up), in ms; each run
// starts with reset() (outside the timing), e.g. poisoning what the kernel writes.
template <class Reset, class Run>
float best_of_runs(int reps, Reset&& reset, Run&& run) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  float best = 1e30f;
  for (int rep = 0; rep < reps; ++rep) {
    reset();
    cudaEventRecord(e0);
    run();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep > 0 && ms < best) best = ms;
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return best;
}
