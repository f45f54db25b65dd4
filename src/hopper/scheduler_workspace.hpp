// Device memory of one launch of the persistent scheduler: the dynamic tile counter and room
// for the split tail's partial states.
//
// Launches that may run at the same time must never share a counter, and the counter must be
// zero when a launch starts. A launch leaves its counter zero again (the last CTA resets it,
// tile_scheduler.cuh), so a counter can serve every launch that is ordered after the previous
// one, and a zeroing operation before each launch (a memset on the stream: ~2-4 us of GPU time
// between two kernels, 2-3% at N = 512, run 82) is not needed. Hence counter slots, zeroed once
// when created:
//   - an eager launch uses its stream's slot: its stream's unique id (cudaStreamGetId, never
//     reused, unlike a handle, which a new stream may take over while a destroyed one still has
//     work queued), and for cudaStreamPerThread the calling thread's, since that one handle
//     names a different stream in every host thread;
//   - a launch captured into a CUDA graph gets a slot of its own, never given to anything else,
//     because the graph may be replayed at any time beside anything.
// Slots live for the process's life: 8 bytes per stream or captured launch. Partial states
// are taken per launch (common/stream_memory.hpp: stream order when eager, kept memory when
// captured).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <optional>

#include "common/stream_memory.hpp"

namespace warpattn::detail {

class SchedulerWorkspace {
 public:
  // For launches on `stream` of the current device; partial_bytes (0: none) of room for partial
  // states, released in stream order when the object goes out of scope (keep it until the
  // launches that use them are enqueued).
  SchedulerWorkspace(cudaStream_t stream, size_t partial_bytes);

  int* tile_counter() const { return counter_; }
  float* partials() const { return partials_ ? static_cast<float*>(partials_->get()) : nullptr; }

 private:
  int* counter_ = nullptr;
  std::optional<StreamMemory> partials_;
};

}  // namespace warpattn::detail
