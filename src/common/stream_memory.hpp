// Device memory that lives for a few launches on one stream: allocated and freed in stream
// order (cudaMallocFromPoolAsync / cudaFreeAsync) from warpattn's own memory pool of the
// current device.
//
// Why stream order: memory that one launch uses must not be used by another launch that may
// run at the same time, and the host cannot know which those are (two host threads on
// cudaStreamPerThread share one handle; a CUDA graph replays whenever its owner likes). Stream
// order makes it the driver's job: a block is handed out again only once the work that freed it
// is done, or behind a dependency on it.
//
// While the stream is being captured into a CUDA graph, the memory is instead a plain
// cudaMalloc of its own, kept for the process's life: the graph may be replayed at any time,
// beside any other graph, and warpattn cannot know when it is destroyed. So each captured
// launch keeps its scheduler memory, up to ~36 MB with the forward's split tail at d = 256 and
// ~52-68 MB with the backward's tail split at d = 128 and 256 (4K-16K tokens), for as long as the process lives. (The stream-ordered allocator's own form under capture, graph memory
// nodes, would free it with the graph, but would also bind the caller's graph: one
// instantiation at a time, no cloning, no cudaGraphExecUpdate, a child graph only by moving
// ownership.)
//
// Why a pool of our own: the device's default pool gives memory back to the system at every
// synchronisation (release threshold 0), so each call would map pages again. Ours keeps what
// it has grown to (like the caching allocators of PyTorch and JAX) and is used by warpattn
// alone.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace warpattn::detail {

// Runs `call` (CUDA calls that are no operation of any stream: cudaMalloc, or work on a
// private stream that the host waits for) with this thread's stream-capture mode relaxed: a
// capture in global or thread-local mode refuses such calls as potentially unsafe, though they
// are safe here, as PyTorch's caching allocator reasons for its cudaMalloc. Returns call's error.
template <class Call>
cudaError_t outside_capture_rules(const Call& call) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode); e != cudaSuccess) return e;
  const cudaError_t e = call();
  cudaThreadExchangeStreamCaptureMode(&mode);
  return e;
}

class StreamMemory {
 public:
  // `bytes` of device memory on the current device, usable by work enqueued on `stream` after
  // this call; `what` names the use in the error thrown when the allocation fails.
  StreamMemory(size_t bytes, cudaStream_t stream, const char* what);
  // Frees it in stream order: after all work enqueued on the stream before the destructor
  // (memory taken under capture is kept).
  ~StreamMemory();
  StreamMemory(const StreamMemory&) = delete;
  StreamMemory& operator=(const StreamMemory&) = delete;

  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  bool captured_ = false;  // taken while the stream was captured: kept
};

}  // namespace warpattn::detail
