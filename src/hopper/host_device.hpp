// Functions shared by the kernels and the CPU tests that check them.
#pragma once

#if defined(__CUDACC__)
#define WARPATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define WARPATTN_HOST_DEVICE inline
#endif
