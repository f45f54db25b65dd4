// Hopper kernels use wgmma and setmaxnreg, which exist only on the architecture-specific
// target: build device code with -gencode=arch=compute_90a,code=sm_90a.
#pragma once
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "warpattn Hopper kernels must be built with -gencode=arch=compute_90a,code=sm_90a"
#endif
