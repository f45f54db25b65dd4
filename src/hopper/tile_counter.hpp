// The dynamic tile scheduler's counter: two ints of device memory per (device, stream), zeroed
// once; each launch leaves them zero again (tile_scheduler.cuh), so launches that follow each
// other on a stream can share them, and launches on different streams never do.
#pragma once
#include <cuda_runtime.h>

namespace warpattn::detail {

// The counter for launches on `stream` of the current device, or nullptr while the stream is
// being captured into a graph and none exists yet (allocating then would break the capture;
// the kernel falls back to its static order).
int* tile_counter_for(cudaStream_t stream);

}  // namespace warpattn::detail
