// Runtime arguments of the backward's three kernels (preprocess, main, dQ conversion).
#pragma once
#include <cstdint>

namespace warpattn::detail {

// A (batch, seqlen, heads, head_dim) tensor's rows: strides in elements, head_dim contiguous.
struct RowsView {
  void* data = nullptr;
  int64_t stride_batch = 0, stride_row = 0, stride_head = 0;
#ifdef __CUDACC__
  template <class T>
  __device__ __forceinline__ T* row(int batch, int row, int head) const {
    return static_cast<T*>(data) + batch * stride_batch + row * stride_row + head * stride_head;
  }
#endif
};

struct BackwardParams {
  RowsView dout, out, dq, dk, dv;
  const float* lse = nullptr;  // (B, Hq, Sq)
  int64_t lse_stride_batch = 0, lse_stride_head = 0, lse_stride_row = 0;
  // The workspace (backward/workspace.hpp): [B][Hq][rows] per query row, dq_accum x head_dim.
  float* dq_accum = nullptr;
  float* row_d = nullptr;
  float* lse_log2 = nullptr;
  int* turns = nullptr;  // deterministic mode only
  int batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0;
  int rows = 0;      // seqlen_q rounded up to BackwardWorkspaceLayout::kRowAlign
  int kv_group = 1;  // query heads per KV head
  float scale_log2 = 0;     // softmax_scale · log2(e)
  float softmax_scale = 0;  // dK's and dQ's factor
};

}  // namespace warpattn::detail
