#include "hopper/scheduler_workspace.hpp"

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

namespace {
// The counter first, partial states from a 256-byte boundary on.
constexpr size_t kCounterBytes = 2 * sizeof(int);  // [next tile, CTAs done]
constexpr size_t kPartialsOffset = 256;
}  // namespace

SchedulerWorkspace::SchedulerWorkspace(cudaStream_t stream, size_t partial_bytes)
    : memory_(partial_bytes > 0 ? kPartialsOffset + partial_bytes : kCounterBytes, stream, "scheduler workspace") {
  check_cuda(cudaMemsetAsync(memory_.get(), 0, kCounterBytes, stream), "cudaMemsetAsync(tile counter)");
  if (partial_bytes > 0) partials_ = reinterpret_cast<float*>(static_cast<char*>(memory_.get()) + kPartialsOffset);
}

}  // namespace warpattn::detail
