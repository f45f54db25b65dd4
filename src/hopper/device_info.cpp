#include "hopper/device_info.hpp"

#include <mutex>
#include <vector>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

namespace {

// One attribute of the current device, queried once per device. `optional`: a device that
// does not report it gives 0 (not an error), queried again next time.
int cached_attribute(cudaDeviceAttr attr, const char* what, bool optional = false) {
  static std::mutex mutex;
  static std::vector<std::pair<cudaDeviceAttr, std::vector<int>>> cache;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.begin();
  while (it != cache.end() && it->first != attr) ++it;
  if (it == cache.end()) it = cache.insert(cache.end(), {attr, {}});
  std::vector<int>& values = it->second;  // by device ordinal; 0 = not queried yet
  if (device >= static_cast<int>(values.size())) values.resize(device + 1, 0);
  if (values[device] == 0) {
    const cudaError_t e = cudaDeviceGetAttribute(&values[device], attr, device);
    if (optional && e != cudaSuccess) {
      (void)cudaGetLastError();  // (not sticky: clears it)
      values[device] = 0;
    } else {
      check_cuda(e, what);
    }
  }
  return values[device];
}

}  // namespace

int multiprocessor_count() {
  return cached_attribute(cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(multiProcessorCount)");
}

int l2_cache_bytes() {
  return cached_attribute(cudaDevAttrL2CacheSize, "cudaDeviceGetAttribute(l2CacheSize)");
}

int memory_bandwidth_gbps() {
  // kHz x bits: two transfers a clock, 8 bits a byte, 1e6 kB/s a GB/s.
  const int64_t khz = cached_attribute(cudaDevAttrMemoryClockRate, "cudaDeviceGetAttribute(memoryClockRate)", true);
  const int64_t bits = cached_attribute(cudaDevAttrGlobalMemoryBusWidth, "cudaDeviceGetAttribute(globalMemoryBusWidth)", true);
  return static_cast<int>(khz * bits / 4 / 1000000);
}

}  // namespace warpattn::detail
