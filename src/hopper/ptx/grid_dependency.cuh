// Programmatic dependent launch (PTX griddepcontrol, sm_90). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled before the kernel ahead of
// it on the stream has finished: once every CTA of that kernel has issued
// allow_dependent_launch (or exited). It must call wait_for_preceding_grid before it touches
// what that kernel writes: the wait returns once the preceding grid has completed and its
// memory is visible. Both are no-ops for kernels launched without the attribute.
#pragma once
#include "hopper/ptx/arch_guard.cuh"

namespace warpattn::ptx {

__device__ __forceinline__ void wait_for_preceding_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

}  // namespace warpattn::ptx
