// Device memory of one launch of the persistent scheduler: the dynamic tile counter, zeroed
// before the launch, and room for the split tail's partial states. Each launch has its own
// (common/stream_memory.hpp says why and how), so launches that run at the same time never
// share a counter.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "common/stream_memory.hpp"

namespace warpattn::detail {

class SchedulerWorkspace {
 public:
  // Enqueues the counter's zeroing on `stream`; partial_bytes (0: none) of room for partial
  // states. Freed in stream order when the object goes out of scope, so keep it until the
  // launches that use it are enqueued.
  SchedulerWorkspace(cudaStream_t stream, size_t partial_bytes);

  int* tile_counter() const { return static_cast<int*>(memory_.get()); }
  float* partials() const { return partials_; }

 private:
  StreamMemory memory_;
  float* partials_ = nullptr;
};

}  // namespace warpattn::detail
