#include "hopper/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "hopper/tensor_map_cache.hpp"

namespace warpattn::detail {
namespace {

// The driver's encoder, reached through the runtime so the library needs no -lcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      cudaGetLastError();
      throw Error(std::string("cuTensorMapEncodeTiled is not available from the CUDA driver: ") +
                  cudaGetErrorString(e));
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

namespace {

CUtensorMap encode(const TensorView& t, const char* name, const cuuint64_t (&dims)[5],
                   const cuuint64_t (&strides)[4], const cuuint32_t (&box)[5], int swizzle_bytes) {
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  // TMA has no FP8 type: e4m3 bytes travel as UINT8.
  const CUtensorMapDataType type = t.dtype == DType::bf16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : t.dtype == DType::f16  ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  TensorMapKey key;
  key.data = t.data;
  std::copy(dims, dims + 5, key.dims);
  std::copy(strides, strides + 4, key.strides);
  std::copy(box, box + 5, key.box);
  key.type = static_cast<int32_t>(type);
  key.swizzle = swizzle_bytes;
  // 16 maps: a forward takes 3, a KV-cache call up to 5, a backward 4.
  thread_local TensorMapCache<16> recent;
  return recent.get(key, [&](const TensorMapKey&) {
    CUtensorMap map;
    const CUresult r = tensor_map_encoder()(
        &map, type, 5, t.data, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle_bytes == 0    ? CU_TENSOR_MAP_SWIZZLE_NONE
        : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                              : CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
      throw Error(std::string(name) + ": cuTensorMapEncodeTiled failed (CUresult " +
                  std::to_string(static_cast<int>(r)) + ") for a tensor of shape (" +
                  std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) + ", " +
                  std::to_string(t.shape[2]) + ", " + std::to_string(t.shape[3]) + ")");
    return map;
  });
}

}  // namespace

CUtensorMap make_panel_tensor_map(const TensorView& t, const char* name, int box_rows,
                                  int box_panels, int panel_bytes) {
  const int64_t batch = t.shape[0], seqlen = t.shape[1], heads = t.shape[2], dim = t.shape[3];
  const int64_t esize = dtype_size(t.dtype);
  const int64_t panel = panel_bytes / esize;  // elements in a panel row
  // A dimension of size 1 is never stepped over; give it a natural stride so that an
  // arbitrary one (PyTorch keeps any stride there) cannot upset the encoder.
  auto stride_bytes = [&](int axis, int64_t natural) {
    return static_cast<cuuint64_t>((t.shape[axis] == 1 ? natural : t.stride[axis]) * esize);
  };
  if (esize == 2) {
    // 16-bit: {head_dim, seqlen, 1, heads, batch} with one-panel boxes, loaded a panel at a
    // time (panel_tile.cuh), so that a head dim between compiled ones has the columns past it
    // zero-filled (the size-1 axis is never stepped over: any valid stride).
    const cuuint64_t dims[5] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(seqlen), 1,
                                static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
    const cuuint64_t strides[4] = {stride_bytes(1, heads * dim), static_cast<cuuint64_t>(panel_bytes),
                                   stride_bytes(2, dim), stride_bytes(0, seqlen * heads * dim)};
    const cuuint32_t box[5] = {static_cast<cuuint32_t>(panel), static_cast<cuuint32_t>(box_rows), 1, 1, 1};
    return encode(t, name, dims, strides, box, panel_bytes);
  }
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(panel), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(dim / panel), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[4] = {stride_bytes(1, heads * dim), static_cast<cuuint64_t>(panel_bytes), stride_bytes(2, dim),
                                 stride_bytes(0, seqlen * heads * dim)};
  const cuuint32_t box[5] = {static_cast<cuuint32_t>(panel), static_cast<cuuint32_t>(box_rows),
                             static_cast<cuuint32_t>(box_panels), 1, 1};
  return encode(t, name, dims, strides, box, panel_bytes);
}

CUtensorMap make_packed_q_tensor_map(const TensorView& q, const char* name, int heads, int positions, int panel_bytes) {
  const int64_t esize = dtype_size(q.dtype);  // 2
  const auto bytes = [&](int64_t elements) { return static_cast<cuuint64_t>(elements * esize); };
  const int64_t chunks = q.shape[2] / heads;
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(q.shape[3]), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(q.shape[1]), static_cast<cuuint64_t>(chunks),
                              static_cast<cuuint64_t>(q.shape[0])};
  // A size-1 axis is never stepped over: a natural stride (as make_panel_tensor_map's).
  const cuuint64_t strides[4] = {bytes(heads == 1 ? q.shape[3] : q.stride[2]),
                                 bytes(q.shape[1] == 1 ? q.shape[2] * q.shape[3] : q.stride[1]),
                                 bytes(chunks == 1 ? heads * q.shape[3] : heads * q.stride[2]),
                                 bytes(q.shape[0] == 1 ? q.shape[1] * q.shape[2] * q.shape[3] : q.stride[0])};
  const cuuint32_t box[5] = {static_cast<cuuint32_t>(panel_bytes / esize), static_cast<cuuint32_t>(heads),
                             static_cast<cuuint32_t>(positions), 1, 1};
  return encode(q, name, dims, strides, box, panel_bytes);
}

CUtensorMap make_vt_tensor_map(const TensorView& vt, const char* name, int box_keys) {
  const int64_t batch = vt.shape[0], heads = vt.shape[1], dim = vt.shape[2], keys = vt.shape[3];
  auto stride_bytes = [&](int axis, int64_t natural) {  // e4m3: one byte per element
    return static_cast<cuuint64_t>(vt.shape[axis] == 1 ? natural : vt.stride[axis]);
  };
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(keys), static_cast<cuuint64_t>(dim), 1,
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[4] = {stride_bytes(2, keys), stride_bytes(2, keys) * dim, stride_bytes(1, dim * keys),
                                 stride_bytes(0, heads * dim * keys)};
  const cuuint32_t box[5] = {static_cast<cuuint32_t>(box_keys), static_cast<cuuint32_t>(dim), 1, 1, 1};
  return encode(vt, name, dims, strides, box, 128);
}

CUtensorMap make_vt_slices_tensor_map(const TensorView& vt, const char* name, int box_keys) {
  const int64_t pages = vt.shape[0], heads = vt.shape[1], slices = vt.shape[2], dim = vt.shape[3] / 16;
  auto stride_bytes = [&](int axis, int64_t natural) {  // e4m3: one byte per element
    return static_cast<cuuint64_t>(vt.shape[axis] == 1 ? natural : vt.stride[axis]);
  };
  // {128 bytes, head_dim / 8 rows of them, slices of the page, heads, pages}: a slice (head_dim
  // x 16 bytes) is head_dim / 8 contiguous rows of 128 bytes, so a box of box_keys / 16 slices
  // lands slice after slice, each as it lies in memory, in rows of 128 bytes.
  const cuuint64_t dims[5] = {128, static_cast<cuuint64_t>(dim / 8), static_cast<cuuint64_t>(slices),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(pages)};
  const cuuint64_t strides[4] = {128, stride_bytes(2, 16 * dim), stride_bytes(1, slices * 16 * dim),
                                 stride_bytes(0, heads * slices * 16 * dim)};
  const cuuint32_t box[5] = {128, static_cast<cuuint32_t>(dim / 8), static_cast<cuuint32_t>(box_keys / 16), 1, 1};
  return encode(vt, name, dims, strides, box, 0);
}

}  // namespace warpattn::detail
