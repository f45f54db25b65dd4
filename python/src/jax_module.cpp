// warpattn._warpattn_jax: the XLA FFI handlers (jax_ffi.cpp) as a module of their own, built
// only where jaxlib's FFI headers were found and imported only by warpattn.jax_ffi, after JAX.
//
// Why apart from _warpattn: with the handlers inside _warpattn, loading it before JAX made
// `import ml_dtypes` (and so `import jax`) crash in ml_dtypes' float4 finfo on the H200 host
// (jax 0.11.2, run 114), while the same module without them did not. Kept apart, `import
// warpattn` loads no code built against jaxlib's headers, and warpattn.jax_ffi imports JAX (and
// ml_dtypes) before this module.
#include <nanobind/nanobind.h>

#include "jax_ffi.hpp"

NB_MODULE(_warpattn_jax, m) { warpattn_python::add_jax_ffi(m); }
