// Device memory the persistent scheduler keeps per (device, stream): the dynamic tile
// counter (zeroed once; every launch leaves it zero again, so launches that follow each other
// on a stream share it and launches on different streams never do), and room for the split
// tail's partial states.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace warpattn::detail {

struct SchedulerWorkspace {
  int* tile_counter = nullptr;  // [next tile, CTAs done]
  void* partials = nullptr;     // at least the bytes asked for, or nullptr
};

// The workspace for launches on `stream` of the current device, with partial_bytes (0: none)
// of room for partial states. Buffers are kept for the process's life (a captured graph may
// hold their addresses); a larger request adds a larger buffer. While the stream is being
// captured into a graph nothing is allocated (that would break the capture): what exists is
// returned, its members nullptr where it falls short, and the kernel then takes its static
// order or leaves the tail whole.
SchedulerWorkspace scheduler_workspace_for(cudaStream_t stream, size_t partial_bytes);

}  // namespace warpattn::detail
