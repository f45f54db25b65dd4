// seqlen_k == 0: no query row has a key, so O is zero and LSE is -inf (the convention that
// lets split-KV and ring attention merge such a partial with weight exp(-inf) = 0), or with
// attention sinks the row's sink (its denominator's only term).
#include <algorithm>
#include <cmath>

#include "hopper/launch.hpp"
#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

__global__ void fill_no_key_rows_kernel(uint16_t* out, int64_t rows, int heads, int seqlen,
                                        int head_dim, int64_t sb, int64_t ss, int64_t sh,
                                        float* lse, int64_t lb, int64_t lh, int64_t ls,
                                        const float* sinks, int64_t sinks_stride) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i % heads);
    const int64_t s = (i / heads) % seqlen, b = i / heads / seqlen;
    uint16_t* row = out + b * sb + s * ss + h * sh;
    for (int d = 0; d < head_dim; ++d) row[d] = 0;  // +0 in fp16 and bf16
    if (lse) lse[b * lb + h * lh + s * ls] = sinks ? sinks[h * sinks_stride] : -INFINITY;
  }
}

static void fill_rows(const TensorView& out, const std::optional<TensorView>& lse, cudaStream_t stream,
                      const float* sinks = nullptr, int64_t sinks_stride = 0) {
  const int64_t rows = out.shape[0] * out.shape[1] * out.shape[2];
  if (rows == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((rows + 255) / 256, 65536));
  fill_no_key_rows_kernel<<<blocks, 256, 0, stream>>>(
      static_cast<uint16_t*>(out.data), rows, static_cast<int>(out.shape[2]), static_cast<int>(out.shape[1]),
      static_cast<int>(out.shape[3]), out.stride[0], out.stride[1], out.stride[2],
      lse ? static_cast<float*>(lse->data) : nullptr, lse ? lse->stride[0] : 0, lse ? lse->stride[1] : 0,
      lse ? lse->stride[2] : 0, sinks, sinks_stride);
  check_cuda(cudaGetLastError(), "fill_no_key_rows_kernel: launch failed");
}

void fill_no_key_rows(const ForwardProblem& p, const TensorView& out, const std::optional<TensorView>& lse,
                      cudaStream_t stream) {
  fill_rows(out, lse, stream, p.sinks, p.sinks_stride);
}

void zero_rows(const TensorView& t, cudaStream_t stream) { fill_rows(t, std::nullopt, stream); }

__global__ void zero_floats_kernel(float* data, int64_t n, int64_t stride) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    data[i * stride] = 0.f;
}

void zero_floats(float* data, int64_t n, int64_t stride, cudaStream_t stream) {
  if (n == 0) return;
  zero_floats_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024)), 256, 0, stream>>>(data, n,
                                                                                                         stride);
  check_cuda(cudaGetLastError(), "zero_floats_kernel: launch failed");
}

}  // namespace warpattn::detail
