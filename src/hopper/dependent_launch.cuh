// Host side of programmatic dependent launch (ptx/grid_dependency.cuh): a small kernel that
// follows a big one on the stream (the KV-cache combine after the attention) is launched so that
// its scheduling overlaps the big one's tail instead of waiting for it to drain; the kernel
// itself waits (wait_for_preceding_grid) before it reads what the big one wrote.
#pragma once

#include <cuda_runtime.h>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const char* what,
                      Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

}  // namespace warpattn::detail
