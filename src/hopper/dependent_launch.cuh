// Host side of programmatic dependent launch (ptx/grid_dependency.cuh): a kernel that follows
// another on the stream (the KV-cache combine after the attention, an E4M3 cache's attention
// after its Q quantisation) is launched so that its scheduling and prologue overlap the other's
// tail instead of waiting for it to drain; the kernel itself waits (wait_for_preceding_grid)
// before it reads what the other wrote.
#pragma once

#include <cuda_runtime.h>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream,
                      const char* what, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = dynamic_smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

}  // namespace warpattn::detail
