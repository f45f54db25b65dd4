// Names of the element types and the row-major view constructor: the two small helpers of the
// public API that every message and every test uses.
#include "warpattn/warpattn.hpp"

namespace warpattn {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::f32:
      return "float32";
    case DType::e4m3:
      return "float8_e4m3fn";
    case DType::s8:
      return "int8";
    case DType::s32:
      return "int32";
  }
  // A value outside the enum can arrive through a cast (e.g. from the C API or ctypes);
  // messages must still print something rather than read a null string.
  return "unknown dtype";
}

TensorView make_contiguous_view(void* data, DType dtype, int rank, const int64_t* shape) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  // TensorView holds at most four dimensions; a wrong rank is kept (clamped only for the
  // loops below) so that validation reports it instead of this helper silently fixing it.
  view.rank = rank;
  const int n = rank < 0 ? 0 : (rank > 4 ? 4 : rank);
  int64_t step = 1;
  for (int i = n - 1; i >= 0; --i) {
    view.shape[i] = shape[i];
    view.stride[i] = step;
    // As PyTorch does, a zero-sized dimension counts as size 1 here, so an empty tensor still
    // gets positive, TMA-legal strides for its other dimensions.
    step *= shape[i] > 1 ? shape[i] : 1;
  }
  return view;
}

}  // namespace warpattn
