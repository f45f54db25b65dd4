// warpattn's XLA FFI handlers (JAX under jax.jit), built into the module _warpattn_jax
// (jax_module.cpp) when jaxlib's FFI headers are found at build time (CMake:
// WARPATTN_JAX_INCLUDE_DIR).
#pragma once

#include <nanobind/nanobind.h>

namespace warpattn_python {

// Adds to the module:
//   jax_ffi_targets()  -> {target name: PyCapsule of its XLA_FFI_Handler}, for
//                         jax.ffi.register_ffi_target(name, capsule, platform="CUDA");
//   jax_ffi_validate(target, operands, results, attrs)
//                      -> None, or ValueError with warpattn's message: every argument rule the
//                         handler's call would check, from shapes and dtypes alone (operands
//                         and results: sequences of (shape, dtype name), as the FFI call gets
//                         them; attrs: the call's attributes by name);
//   jax_ffi_workspace_bytes(target, q, batch, attrs)
//                      -> the size of the uint8 workspace result of a backward target.
void add_jax_ffi(nanobind::module_& m);

}  // namespace warpattn_python
