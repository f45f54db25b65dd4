#include "hopper/scheduler_workspace.hpp"

#include <map>
#include <mutex>
#include <utility>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

namespace {
// The counter first, partial states from a 256-byte boundary on.
constexpr size_t kCounterBytes = 2 * sizeof(int);
constexpr size_t kPartialsOffset = (kCounterBytes + 255) / 256 * 256;

struct Buffer {
  char* base = nullptr;
  size_t partial_bytes = 0;
};
}  // namespace

SchedulerWorkspace scheduler_workspace_for(cudaStream_t stream, size_t partial_bytes) {
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, Buffer> buffers;  // the newest per stream
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  Buffer& b = buffers[std::make_pair(device, stream)];
  if (b.base == nullptr || b.partial_bytes < partial_bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (capture == cudaStreamCaptureStatusNone) {
      // A new buffer with its own zeroed counter; the old one stays (never freed).
      char* base = nullptr;
      check_cuda(cudaMalloc(&base, kPartialsOffset + partial_bytes), "cudaMalloc(scheduler workspace)");
      check_cuda(cudaMemsetAsync(base, 0, kCounterBytes, stream), "cudaMemsetAsync(scheduler workspace)");
      b = {base, partial_bytes};
    }
  }
  SchedulerWorkspace w;
  if (b.base == nullptr) return w;
  w.tile_counter = reinterpret_cast<int*>(b.base);
  if (b.partial_bytes >= partial_bytes && partial_bytes > 0) w.partials = b.base + kPartialsOffset;
  return w;
}

}  // namespace warpattn::detail
