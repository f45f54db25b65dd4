// Where a call runs: the device that every tensor of the call lives on.
//
// The kernels launch on the current device, and a stream, a tensor map or a workspace of one
// device is meaningless on another, so a call whose tensors live on device 1 while device 0 is
// current must switch to device 1 for its launches (and switch back), and a call whose tensors
// live on two devices, or in host memory, must be refused before anything runs.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>
#include <span>

#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

// One argument's memory, for the device check: its name for messages and its view.
struct NamedView {
  const char* name;
  const TensorView* view;  // nullptr: an absent optional argument
};

// Makes the device of the call's tensors current for the scope's life and restores the
// previous current device on exit. Throws Error, before anything is launched:
//   - without a CUDA device ("no CUDA device with compute capability 9.0 (Hopper) found: ...");
//   - when a non-empty tensor's memory is not device memory (a host pointer, pinned host memory,
//     an address CUDA does not know);
//   - when two tensors live on different devices, or `stream` belongs to another device;
//   - when the device is not a Hopper GPU (compute capability 9.0).
// Empty tensors are never accessed and take no part.
class DeviceScope {
 public:
  DeviceScope(std::initializer_list<NamedView> tensors, cudaStream_t stream)
      : DeviceScope(std::span<const NamedView>(tensors.begin(), tensors.size()), stream) {}
  DeviceScope(std::span<const NamedView> tensors, cudaStream_t stream);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  int device() const { return device_; }

 private:
  int device_ = 0;
  int previous_ = 0;
};

}  // namespace warpattn::detail
