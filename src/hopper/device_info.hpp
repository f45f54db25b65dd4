// Device properties the launch needs, queried once per device; kernel attributes set once per
// device.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

// Streaming multiprocessors of the current device.
int multiprocessor_count();

// Bytes of L2 cache of the current device.
int l2_cache_bytes();

// The current device's peak memory bandwidth in GB/s (from its memory clock and bus width; 0 if
// the device does not report them).
int memory_bandwidth_gbps();

// Lets `kKernel` take `bytes` of dynamic shared memory on the current device: cudaFuncSetAttribute
// once per device and kernel, not before every launch (a runtime call each time: issue 16's host
// cost). The kernel is a template argument so that each kernel has its own flags: every forward
// config's kernel has the same pointer type, and flags kept per type left all but the first
// kernel of a process without its attribute (run 125: "launch failed: invalid argument"). An
// attribute lost to cudaDeviceReset shows as the launch's error, never as a wrong result.
template <auto kKernel>
void allow_shared_memory(int bytes, const char* what) {
  static std::atomic<uint64_t> devices_done{0};  // bit d: device d (devices past 63 set it every time)
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (devices_done.load(std::memory_order_acquire) & bit) != 0) return;
  check_cuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  devices_done.fetch_or(bit, std::memory_order_release);
}

}  // namespace warpattn::detail
