// An array argument of the extension's calls: the facts the library needs (address, dtype, shape,
// strides, device type) of a PyTorch tensor read from its attributes, of anything else taken
// through DLPack (nb::ndarray).
//
// Why: DLPack's export is the largest host cost of a small call. torch.Tensor.__dlpack__ builds
// a managed tensor and a capsule per array, ~2 us each on the 2-core dev machine (5 arrays: 10 of
// the 14 us a refused call took there, against 4.3 us for NumPy's buffer protocol); reading
// data_ptr(), shape, stride() and dtype costs a fraction of that. Only what the fast path knows
// takes it: an exact torch.Tensor or nn.Parameter (never a subclass such as FakeTensor), on CUDA
// (or the CPU, which the binding refuses by name), of a dtype in the table below, without the
// negative bit, of rank 8 at most; anything else goes through DLPack, so its errors stay the ones
// it gave before.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace warpattn_py {

namespace nb = nanobind;

class Array {
 public:
  static constexpr int kMaxRank = 8;
  nb::dlpack::dtype dtype() const { return nd_ ? nd_->dtype() : dtype_; }
  size_t ndim() const { return nd_ ? nd_->ndim() : static_cast<size_t>(rank_); }
  size_t shape(size_t i) const { return nd_ ? nd_->shape(i) : static_cast<size_t>(shape_[i]); }
  int64_t stride(size_t i) const { return nd_ ? nd_->stride(i) : stride_[i]; }
  const void* data() const { return nd_ ? nd_->data() : data_; }
  int device_type() const { return nd_ ? nd_->device_type() : device_type_; }
  size_t nbytes() const {
    if (nd_) return nd_->nbytes();
    size_t n = (dtype_.bits + 7) / 8;
    for (int i = 0; i < rank_; ++i) n *= static_cast<size_t>(shape_[i]);
    return n;
  }

  // Fills the facts of a CUDA torch.Tensor the fast path knows; false for anything else.
  bool read_torch_tensor(PyObject* src);
  void take_ndarray(nb::ndarray<nb::ro>&& a) { nd_.emplace(std::move(a)); }
  bool through_dlpack() const { return nd_.has_value(); }

 private:
  std::optional<nb::ndarray<nb::ro>> nd_;  // the DLPack path's array (it keeps the export alive)
  const void* data_ = nullptr;
  nb::dlpack::dtype dtype_{};
  int device_type_ = 0;  // DLPack's code: CUDA or CPU (the binding refuses the latter by name)
  int rank_ = 0;
  int64_t shape_[kMaxRank] = {};
  int64_t stride_[kMaxRank] = {};
};

namespace torch_fast_path {

// What the fast path takes from torch, found once torch is imported (the extension never imports
// it: a call without torch tensors never needs it). Kept for the process' life (one reference
// each, never released: the interpreter's own modules outlive every call).
struct Torch {
  PyTypeObject* tensor = nullptr;
  PyTypeObject* parameter = nullptr;
  struct Known {
    PyObject* dtype;
    nb::dlpack::dtype dl;
  };
  Known known[8] = {};
  int known_count = 0;
  PyObject *is_cuda, *is_cpu, *data_ptr, *shape, *stride, *dtype, *is_neg;  // interned names
};

inline Torch* torch_if_imported() {
  static Torch* cached = nullptr;
  if (cached != nullptr) return cached;
  PyObject* name = PyUnicode_FromString("torch");
  PyObject* module = name != nullptr ? PyImport_GetModule(name) : nullptr;  // new reference; null: not imported
  Py_XDECREF(name);
  if (module == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  static Torch t;
  t.known_count = 0;  // a failed attempt below may have filled some
  bool ok = true;
  const auto attr = [&](PyObject* from, const char* name) -> PyObject* {
    PyObject* a = ok ? PyObject_GetAttrString(from, name) : nullptr;
    if (a == nullptr) ok = false;
    return a;
  };
  PyObject* tensor = attr(module, "Tensor");
  PyObject* nn = attr(module, "nn");
  PyObject* parameter = nn != nullptr ? attr(nn, "Parameter") : nullptr;
  using code = nb::dlpack::dtype_code;
  const struct {
    const char* name;
    code c;
    uint8_t bits;
  } table[] = {{"float16", code::Float, 16}, {"bfloat16", code::Bfloat, 16}, {"float32", code::Float, 32},
               {"float64", code::Float, 64}, {"int32", code::Int, 32},        {"int64", code::Int, 64},
               {"uint8", code::UInt, 8},     {"int8", code::Int, 8}};
  for (const auto& e : table) {
    PyObject* d = attr(module, e.name);
    if (d != nullptr && t.known_count < 8)
      t.known[t.known_count++] = {d, nb::dlpack::dtype{static_cast<uint8_t>(e.c), e.bits, 1}};
  }
  Py_DECREF(module);
  if (!ok || !PyType_Check(tensor) || !PyType_Check(parameter)) {
    PyErr_Clear();
    return nullptr;  // an unexpected torch: every tensor takes DLPack
  }
  t.tensor = reinterpret_cast<PyTypeObject*>(tensor);
  t.parameter = reinterpret_cast<PyTypeObject*>(parameter);
  t.is_cuda = PyUnicode_InternFromString("is_cuda");
  t.is_cpu = PyUnicode_InternFromString("is_cpu");
  t.data_ptr = PyUnicode_InternFromString("data_ptr");
  t.shape = PyUnicode_InternFromString("shape");
  t.stride = PyUnicode_InternFromString("stride");
  t.dtype = PyUnicode_InternFromString("dtype");
  t.is_neg = PyUnicode_InternFromString("is_neg");
  cached = &t;
  return cached;
}

// A new reference to src.name, or src.name() where `call`; null (error cleared) on failure.
inline PyObject* get(PyObject* src, PyObject* name, bool call) {
  PyObject* r = call ? PyObject_CallMethodNoArgs(src, name) : PyObject_GetAttr(src, name);
  if (r == nullptr) PyErr_Clear();
  return r;
}

// A tuple of at most Array::kMaxRank ints into out; its length, or -1.
inline int read_ints(PyObject* tuple, int64_t* out) {
  if (tuple == nullptr || !PyTuple_Check(tuple)) return -1;
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  if (n > Array::kMaxRank) return -1;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return -1;
    }
    out[i] = v;
  }
  return static_cast<int>(n);
}

}  // namespace torch_fast_path

inline bool Array::read_torch_tensor(PyObject* src) {
  using namespace torch_fast_path;
  Torch* t = torch_if_imported();
  if (t == nullptr || (Py_TYPE(src) != t->tensor && Py_TYPE(src) != t->parameter)) return false;
  // CUDA, or CPU (refused by the binding as DLPack's would be); any other device takes DLPack.
  PyObject* is_cuda = get(src, t->is_cuda, false);
  const bool cuda = is_cuda == Py_True;
  Py_XDECREF(is_cuda);
  bool cpu = false;
  if (!cuda) {
    PyObject* is_cpu = get(src, t->is_cpu, false);
    cpu = is_cpu == Py_True;
    Py_XDECREF(is_cpu);
    if (!cpu) return false;
  }
  PyObject* dtype = get(src, t->dtype, false);
  const Torch::Known* known = nullptr;
  for (int i = 0; i < t->known_count; ++i)
    if (t->known[i].dtype == dtype) known = &t->known[i];
  Py_XDECREF(dtype);
  if (known == nullptr) return false;
  PyObject* neg = get(src, t->is_neg, true);
  const bool negative = neg != Py_False;  // a lazily negated view (or no answer): DLPack decides
  Py_XDECREF(neg);
  if (negative) return false;
  PyObject* ptr = get(src, t->data_ptr, true);
  PyObject* shape = get(src, t->shape, false);
  PyObject* stride = get(src, t->stride, true);
  int64_t shape_values[kMaxRank], stride_values[kMaxRank];
  const int rank = read_ints(shape, shape_values);
  const int stride_rank = read_ints(stride, stride_values);
  const unsigned long long address = ptr != nullptr ? PyLong_AsUnsignedLongLong(ptr) : 0;
  const bool address_ok = ptr != nullptr && !(address == static_cast<unsigned long long>(-1) && PyErr_Occurred());
  if (!address_ok) PyErr_Clear();
  Py_XDECREF(ptr);
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  if (!address_ok || rank < 0 || stride_rank != rank) return false;
  data_ = reinterpret_cast<const void*>(static_cast<uintptr_t>(address));
  dtype_ = known->dl;
  device_type_ = cuda ? nb::device::cuda::value : nb::device::cpu::value;
  rank_ = rank;
  for (int i = 0; i < rank; ++i) {
    shape_[i] = shape_values[i];
    stride_[i] = stride_values[i];
  }
  return true;
}

}  // namespace warpattn_py

namespace nanobind::detail {

template <>
struct type_caster<warpattn_py::Array> {
  NB_TYPE_CASTER(warpattn_py::Array, const_name("ndarray"))

  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    value = warpattn_py::Array();
    if (value.read_torch_tensor(src.ptr())) return true;
    make_caster<ndarray<ro>> dlpack;
    if (!dlpack.from_python(src, flags, cleanup)) return false;
    value.take_ndarray(std::move(dlpack.value));
    return true;
  }
};

}  // namespace nanobind::detail
