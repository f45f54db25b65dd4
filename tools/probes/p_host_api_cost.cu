// What each CUDA runtime and driver call on warpattn's host path costs on the GPU host (issue
// 16's host cost: the C ABI took 10.3 us a call in run 131 against a 4.2 us launch floor, and
// validation is 0.5 us on the dev machine). Each call is timed alone in a tight loop, in the
// order the library makes them for one forward call: the device scope (device count, current
// device, each tensor's pointer attributes, the stream's capture state), the scheduler's counter
// slot (current device, capture state, stream id), a tensor-map encode (the cache's miss), and
// launches of an empty kernel, plain and through cudaLaunchKernelEx with the attributes the
// forward sets (cluster dims 1, programmatic stream serialization).
// Build and run on the H200 from the repository root:
//   nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/p_host tools/probes/p_host_api_cost.cu -lcuda && /tmp/p_host
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void empty_kernel() {}

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Microseconds per call of f over n calls, after a warm-up; the stream synchronised at the end
// (launches queue up: their host cost is what the loop measures, the device drains them after).
template <class F>
double per_call_us(const char* name, F&& f, cudaStream_t stream, int n = 20000) {
  for (int i = 0; i < 200; ++i) f();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
  std::printf("  %-58s %7.3f us\n", name, us);
  return us;
}

}  // namespace

int main() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void* buffer = nullptr;
  check(cudaMalloc(&buffer, 1 << 20), "cudaMalloc");
  int sink = 0;
  std::printf("host cost per call (a tight loop of 20000 calls each):\n");
  per_call_us("cudaGetDeviceCount", [&] { cudaGetDeviceCount(&sink); }, stream);
  per_call_us("cudaGetDevice", [&] { cudaGetDevice(&sink); }, stream);
  per_call_us("cudaSetDevice (to the current one)", [&] { cudaSetDevice(0); }, stream);
  cudaPointerAttributes attributes{};
  per_call_us("cudaPointerGetAttributes (device memory)", [&] { cudaPointerGetAttributes(&attributes, buffer); },
              stream);
  cudaStreamCaptureStatus capture{};
  per_call_us("cudaStreamIsCapturing", [&] { cudaStreamIsCapturing(stream, &capture); }, stream);
  unsigned long long id = 0;
  per_call_us("cudaStreamGetId", [&] { cudaStreamGetId(stream, &id); }, stream);
  int value = 0;
  per_call_us("cudaDeviceGetAttribute (multiprocessors)",
              [&] { cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0); }, stream);

  // A 5-D panel map like make_panel_tensor_map's (bf16, 64 columns x 128 rows boxes, 128B swizzle).
  CUtensorMap map;
  const cuuint64_t dims[5] = {128, 1024, 1, 8, 2};
  const cuuint64_t strides[4] = {8 * 128 * 2, 128, 128 * 2, 1024 * 8 * 128 * 2};
  const cuuint32_t box[5] = {64, 128, 1, 1, 1}, elem[5] = {1, 1, 1, 1, 1};
  per_call_us("cuTensorMapEncodeTiled (a cache miss)", [&] {
    cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, buffer, dims, strides, box, elem,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }, stream);

  per_call_us("empty kernel <<<132, 384>>>", [&] { empty_kernel<<<132, 384, 0, stream>>>(); }, stream);
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 1, attrs[0].val.clusterDim.y = 1, attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(132), config.blockDim = dim3(384), config.stream = stream;
  config.attrs = attrs, config.numAttrs = 1;
  per_call_us("cudaLaunchKernelEx, cluster dims", [&] { cudaLaunchKernelEx(&config, empty_kernel); }, stream);
  config.numAttrs = 2;
  per_call_us("cudaLaunchKernelEx, cluster dims + programmatic serialization",
              [&] { cudaLaunchKernelEx(&config, empty_kernel); }, stream);
  check(cudaGetLastError(), "the launches");
  cudaFree(buffer);
  cudaStreamDestroy(stream);
  std::printf("PASS\n");
  return 0;
}
