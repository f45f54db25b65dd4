#include "hopper/device_info.hpp"

#include <mutex>
#include <vector>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

int multiprocessor_count() {
  static std::mutex mutex;
  static std::vector<int> counts;  // by device ordinal; 0 = not queried yet
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(counts.size())) counts.resize(device + 1, 0);
  if (counts[device] == 0)
    check_cuda(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(multiProcessorCount)");
  return counts[device];
}

}  // namespace warpattn::detail
