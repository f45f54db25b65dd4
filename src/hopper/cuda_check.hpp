// CUDA runtime errors become warpattn::Error with what was being done.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so later calls start clean
    throw Error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

}  // namespace warpattn::detail
