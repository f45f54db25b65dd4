#include "common/stream_memory.hpp"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

namespace {

// warpattn's pool on `device`, created on first use and kept for the process's life.
cudaMemPool_t pool_of(int device) {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;  // by device ordinal; nullptr: not created yet
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(pools.size())) pools.resize(device + 1, nullptr);
  if (pools[device] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    check_cuda(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate (warpattn's workspace pool)");
    uint64_t keep_everything = UINT64_MAX;
    check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
               "cudaMemPoolSetAttribute (warpattn's workspace pool)");
    pools[device] = pool;
  }
  return pools[device];
}

}  // namespace

StreamMemory::StreamMemory(size_t bytes, cudaStream_t stream, const char* what) : stream_(stream) {
  const std::string context = std::string(what) + ": allocating " + std::to_string(bytes) + " bytes";
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), (context + " (cudaStreamIsCapturing)").c_str());
  if (capture != cudaStreamCaptureStatusNone) {
    check_cuda(outside_capture_rules([&] { return cudaMalloc(&ptr_, bytes); }),
               (context + " for a captured launch (cudaMalloc)").c_str());
    captured_ = true;
    return;
  }
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaMallocFromPoolAsync(&ptr_, bytes, pool_of(device), stream), (context + " in stream order").c_str());
}

StreamMemory::~StreamMemory() {
  if (ptr_ != nullptr && !captured_) cudaFreeAsync(ptr_, stream_);
}

}  // namespace warpattn::detail
