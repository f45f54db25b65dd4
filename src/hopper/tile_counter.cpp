#include "hopper/tile_counter.hpp"

#include <map>
#include <mutex>
#include <utility>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

int* tile_counter_for(cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;  // kept for the process's life
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, stream);
  if (auto it = counters.find(key); it != counters.end()) return it->second;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  int* counter = nullptr;
  check_cuda(cudaMalloc(&counter, 2 * sizeof(int)), "cudaMalloc(tile counter)");
  check_cuda(cudaMemset(counter, 0, 2 * sizeof(int)), "cudaMemset(tile counter)");
  counters.emplace(key, counter);
  return counter;
}

}  // namespace warpattn::detail
