// The GPU quantisation pass behind warpattn::quantize_fp8 (host-side declarations).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "warpattn/fp8.hpp"

namespace warpattn::detail {

inline constexpr int kFp8BlockRowsDevice = kFp8BlockRows;

enum class QuantizeMode : int {
  block_amax = 0,   // descale from each block's own amax (per-block scaling)
  amax_only = 1,    // write each block's amax into the descale array, no codes (pass 1 of per tensor)
  global_amax = 2,  // descale from *global_amax for every block (pass 2 of per tensor)
};

// Q or K rows: in (B, S, H, D) fp16/bf16 -> out (B, S, H, D) e4m3 (or s8); strides in elements.
struct QuantizeRowsParams {
  bool int8_codes;  // s8 codes (descale amax / 127) instead of e4m3 (amax / 448)
  const void* in;
  int64_t in_stride[3];  // batch, seq, head
  void* out;
  int64_t out_stride[3];
  float* descale;
  int64_t descale_stride[3];  // batch, head, block
  int seqlen;  // a packed batch's: the packed length
  // A packed batch (quantize_fp8_varlen): cu_seqlens (sequences + 1 offsets); the grid's
  // blocks are then padded blocks (backward/workspace.hpp's varlen_row0), each within one
  // sequence or in a gap. Null: dense.
  const int* cu_seqlens;
  int sequences;
  bool rotate;
  uint64_t signs[4];  // bit i set: element i is negated before the Walsh-Hadamard transform
  QuantizeMode mode;
  const float* global_amax;
};

// V (B, S, H, D) -> Vᵀ (B, H, D, padded_keys) e4m3 in kFp8KeyOrder.
struct QuantizeVtParams {
  const void* in;
  int64_t in_stride[3];  // batch, seq, head
  void* out;
  int64_t out_stride[3];  // batch, head, d
  float* descale;
  int64_t descale_stride[3];
  int seqlen;
  const int* cu_seqlens;  // as QuantizeRowsParams'; Vᵀ's columns are then the padded rows
  int sequences;
  int64_t padded_keys;
  int order[16];
  QuantizeMode mode;
  const float* global_amax;
};

void launch_quantize_rows(DType dtype, int head_dim, const QuantizeRowsParams& p, int blocks, int heads,
                          int batch, cudaStream_t stream);
void launch_quantize_vt(DType dtype, int head_dim, const QuantizeVtParams& p, int blocks, int heads, int batch,
                        cudaStream_t stream);
// *out = the largest value of the (n0, n1, n2) array at `values` with element strides s.
void launch_max_reduce(const float* values, const int64_t (&n)[3], const int64_t (&s)[3], float* out,
                       cudaStream_t stream);

}  // namespace warpattn::detail
