// Device memory that lives for a few launches on one stream: allocated and freed in stream
// order (cudaMallocFromPoolAsync / cudaFreeAsync) from warpattn's own memory pool of the
// current device.
//
// Why stream order: memory that one launch uses must not be used by another launch that may
// run at the same time, and the host cannot know which those are (two host threads on
// cudaStreamPerThread share one handle; a CUDA graph replays whenever its owner likes). Stream
// order makes it the driver's job: a block is handed out again only once the work that freed it
// is done, or behind a dependency on it. While the stream is captured into a graph, the
// allocation and the free become graph memory nodes, and each replay's memory is the graph's
// own.
//
// Why a pool of our own: the device's default pool gives memory back to the system at every
// synchronisation (release threshold 0), so each call would map pages again. Ours keeps what
// it has grown to (like the caching allocators of PyTorch and JAX) and is used by warpattn
// alone.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace warpattn::detail {

class StreamMemory {
 public:
  // `bytes` of device memory on the current device, usable by work enqueued on `stream` after
  // this call; `what` names the use in the error thrown when the allocation fails.
  StreamMemory(size_t bytes, cudaStream_t stream, const char* what);
  // Frees it in stream order: after all work enqueued on the stream before the destructor.
  ~StreamMemory();
  StreamMemory(const StreamMemory&) = delete;
  StreamMemory& operator=(const StreamMemory&) = delete;

  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace warpattn::detail
