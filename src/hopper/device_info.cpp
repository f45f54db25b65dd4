#include "hopper/device_info.hpp"

#include <mutex>
#include <vector>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

namespace {

// One attribute of the current device, queried once per device.
int cached_attribute(cudaDeviceAttr attr, const char* what) {
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
  if (values[device] == 0) check_cuda(cudaDeviceGetAttribute(&values[device], attr, device), what);
  return values[device];
}

}  // namespace

int multiprocessor_count() {
  return cached_attribute(cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(multiProcessorCount)");
}

int l2_cache_bytes() {
  return cached_attribute(cudaDevAttrL2CacheSize, "cudaDeviceGetAttribute(l2CacheSize)");
}

}  // namespace warpattn::detail
