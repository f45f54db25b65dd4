// From the run-time head dim and element type of a validated problem to the instantiation that
// serves it: the one list of head dims with kernels, shared by every launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

// f(std::integral_constant<int, D>{}) for D = head_dim; `kernels` names them in the error
// ("kernel", "backward kernel", ...), which validation makes unreachable.
template <class F>
void with_head_dim(int64_t head_dim, const char* kernels, F&& f) {
  switch (kernel_head_dim(head_dim)) {  // a head dim between compiled ones: the next up (panel_tile.cuh)
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
  }
  throw Error("q: head dim " + std::to_string(head_dim) + " has no " + kernels);
}

// MLA's prefill shape has a 16-bit forward kernel of its own, D = 192 (q and k 192, v 128;
// docs/mla-192-128-design.md): q's head dim above 128 and up to 192 with v's at most 128 (MLA's
// 192/128, and the padded dims between) runs there rather than padded to 256.
constexpr bool takes_mla_kernel(int64_t head_dim, int64_t head_dim_v) {
  return head_dim > 128 && head_dim <= 192 && head_dim_v <= 128;
}

// with_head_dim for the 16-bit forward, dense or packed: also the D = 192 kernel (MLA's) and the
// D = 512 one (head dims above 256: forward_kernel_head_dim).
template <class F>
void with_forward_head_dim(int64_t head_dim, int64_t head_dim_v, F&& f) {
  if (forward_kernel_head_dim(head_dim) == 512) return f(std::integral_constant<int, 512>{});
  if (takes_mla_kernel(head_dim, head_dim_v)) return f(std::integral_constant<int, 192>{});
  with_head_dim(head_dim, "kernel", f);
}

// ... and for the KV-cache forward (no MLA kernel): 64, 128, 256, or 512 above 256.
template <class F>
void with_kvcache_head_dim(int64_t head_dim, F&& f) {
  if (forward_kernel_head_dim(head_dim) == 512) return f(std::integral_constant<int, 512>{});
  with_head_dim(head_dim, "kernel", f);
}

// ... and for the backward (no MLA kernel): 64, 128, 256, or 512 above 256 (its kernel: two
// CTAs per key block, one per column half; backward_config.hpp).
template <class F>
void with_backward_head_dim(int64_t head_dim, F&& f) {
  if (forward_kernel_head_dim(head_dim) == 512) return f(std::integral_constant<int, 512>{});
  with_head_dim(head_dim, "backward kernel", f);
}

// f(T{}) with T the 16-bit element type of `dtype` (bf16, else fp16).
template <class F>
void with_16bit_element(DType dtype, F&& f) {
  if (dtype == DType::bf16)
    f(__nv_bfloat16{});
  else
    f(__half{});
}

}  // namespace warpattn::detail
