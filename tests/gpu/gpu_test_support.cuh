// Shared by the GPU tests: device detection (skip with a reason), error checks, device-side
// random fill, and strided attention tensors with host copies of what the GPU sees.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/host_float16.hpp"
#include "harness.hpp"
#include "warpattn/fp8.hpp"
#include "warpattn/warpattn.hpp"

namespace gpu_test {

// Empty when an sm_90 device is present, else why not.
inline std::string why_no_hopper() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  if (count == 0) return "no CUDA device";
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9) return "device 0 is sm_" + std::to_string(major) + std::to_string(minor) + ", not sm_90";
  return "";
}

#define REQUIRE_HOPPER()                                   \
  do {                                                     \
    const std::string why_ = gpu_test::why_no_hopper();    \
    if (!why_.empty()) SKIP("needs an sm_90 GPU: " + why_); \
  } while (0)

#define CUDA_OK(call)                                                               \
  do {                                                                              \
    const cudaError_t e_ = (call);                                                  \
    REQUIRE(e_ == cudaSuccess) << #call << " -> " << cudaGetErrorString(e_);        \
  } while (0)

// The larger of a running worst error and a new one, where NaN is the worst of all
// (std::max(worst, NaN) would keep `worst` and let a NaN pass).
inline double worse(double worst, double err) { return std::isnan(err) ? INFINITY : std::max(worst, err); }

// f(i) for i in [0, n), spread over the host's cores (the CPU references are the slow part).
template <class F>
void parallel_for(int64_t n, F f) {
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < n; i += threads) f(i);
    });
  for (auto& th : pool) th.join();
}

// A seed that differs on every run: fresh random data each time (printed for replay).
// WARPATTN_TEST_SEED=<seed> replays a printed one (every draw then takes it), or puts two
// builds on the same data when they are compared.
inline uint64_t fresh_seed() {
  if (const char* fixed = std::getenv("WARPATTN_TEST_SEED")) return std::strtoull(fixed, nullptr, 10);
  static std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills the logical elements of a strided (B, S, H, D) 16-bit tensor with N(0, 1) values
// (Box-Muller on a counter hash) rounded to bf16 or fp16.
__global__ void fill_normal_kernel(uint16_t* base, int64_t b_n, int64_t s_n, int64_t h_n, int64_t d_n,
                                   int64_t sb, int64_t ss, int64_t sh, uint64_t seed, bool bf16) {
  const int64_t n = b_n * s_n * h_n * d_n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull));
    const float u1 = (static_cast<float>(r >> 40) + 1.f) / 16777217.f;  // (0, 1]
    const float u2 = static_cast<float>((r >> 16) & 0xFFFFFF) / 16777216.f;
    const float x = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    const int64_t d = i % d_n, h = (i / d_n) % h_n, s = (i / d_n / h_n) % s_n, b = i / d_n / h_n / s_n;
    uint16_t bits;
    if (bf16) {
      const __nv_bfloat16 v = __float2bfloat16_rn(x);
      memcpy(&bits, &v, 2);
    } else {
      const __half v = __float2half_rn(x);
      memcpy(&bits, &v, 2);
    }
    base[b * sb + s * ss + h * sh + d] = bits;
  }
}

// A device (B, S, H, D) tensor whose allocation may be larger than its view (padded head,
// sequence and batch strides: gaps that the kernel must never write).
struct DeviceTensor {
  warpattn::TensorView view;
  uint16_t* mem = nullptr;
  int64_t alloc_elems = 0;

  DeviceTensor(warpattn::DType dtype, int64_t b, int64_t s, int64_t h, int64_t d, bool padded) {
    const int64_t hs = padded ? d + 64 : d;  // head stride
    const int64_t ss = h * hs + (padded ? 8 : 0);
    const int64_t bs = s * ss + (padded ? 136 : 0);
    view.dtype = dtype;
    view.rank = 4;
    const int64_t shape[4] = {b, s, h, d}, stride[4] = {bs, ss, hs, 1};
    for (int i = 0; i < 4; ++i) view.shape[i] = shape[i], view.stride[i] = stride[i];
    alloc_elems = std::max<int64_t>(b * bs, 1) + 64;
    if (cudaMalloc(&mem, alloc_elems * 2) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    view.data = mem;
  }
  ~DeviceTensor() { cudaFree(mem); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  void fill_normal(uint64_t seed) {
    fill_normal_kernel<<<1024, 256>>>(mem, view.shape[0], view.shape[1], view.shape[2], view.shape[3],
                                     view.stride[0], view.stride[1], view.stride[2], seed,
                                     view.dtype == warpattn::DType::bf16);
  }
  void poison() { cudaMemset(mem, 0xFF, alloc_elems * 2); }  // NaN in fp16 and bf16
  void upload(const std::vector<uint16_t>& h) { cudaMemcpy(mem, h.data(), alloc_elems * 2, cudaMemcpyHostToDevice); }

  std::vector<uint16_t> raw() const {
    std::vector<uint16_t> h(alloc_elems);
    cudaMemcpy(h.data(), mem, alloc_elems * 2, cudaMemcpyDeviceToHost);
    return h;
  }
  float to_float(uint16_t bits) const {
    return view.dtype == warpattn::DType::bf16 ? warpattn::host::bf16_to_float(bits)
                                               : warpattn::host::f16_to_float(bits);
  }
  // The logical elements, contiguous [B][S][H][D], as floats.
  std::vector<float> logical(const std::vector<uint16_t>& r) const {
    const auto& v = view;
    std::vector<float> out(v.shape[0] * v.shape[1] * v.shape[2] * v.shape[3]);
    int64_t i = 0;
    for (int64_t b = 0; b < v.shape[0]; ++b)
      for (int64_t s = 0; s < v.shape[1]; ++s)
        for (int64_t h = 0; h < v.shape[2]; ++h)
          for (int64_t d = 0; d < v.shape[3]; ++d)
            out[i++] = to_float(r[b * v.stride[0] + s * v.stride[1] + h * v.stride[2] + d]);
    return out;
  }
  // Counts allocation elements outside the view that no longer hold the 0xFFFF poison.
  int64_t written_outside_view(const std::vector<uint16_t>& r) const {
    std::vector<char> inside(alloc_elems, 0);
    const auto& v = view;
    for (int64_t b = 0; b < v.shape[0]; ++b)
      for (int64_t s = 0; s < v.shape[1]; ++s)
        for (int64_t h = 0; h < v.shape[2]; ++h)
          memset(&inside[b * v.stride[0] + s * v.stride[1] + h * v.stride[2]], 1, v.shape[3]);
    int64_t n = 0;
    for (int64_t i = 0; i < alloc_elems; ++i) n += !inside[i] && r[i] != 0xFFFF;
    return n;
  }
};

// Device memory for a contiguous view, poisoned with `poison` bytes.
struct DeviceBuffer {
  void* mem = nullptr;
  size_t bytes = 0;
  DeviceBuffer(size_t n, int poison = 0xFF) : bytes(std::max<size_t>(n, 1)) {
    if (cudaMalloc(&mem, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    cudaMemset(mem, poison, bytes);
  }
  ~DeviceBuffer() { cudaFree(mem); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  template <class T>
  std::vector<T> get() const {
    std::vector<T> h(bytes / sizeof(T));
    cudaMemcpy(h.data(), mem, h.size() * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

inline warpattn::TensorView contiguous(void* p, warpattn::DType t, std::initializer_list<int64_t> shape) {
  const std::vector<int64_t> s(shape);
  return warpattn::make_contiguous_view(p, t, static_cast<int>(s.size()), s.data());
}

inline int64_t blocks_of(int64_t n) { return (n + 127) / 128; }

// The model options of a test case (issue 19), for its description: empty when all are off.
inline std::string describe_model_options(int window_left, int window_right, float softcap, bool sinks) {
  std::string d;
  if (window_left >= 0 || window_right >= 0)
    d += " win=(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
  if (softcap > 0) d += " cap=" + std::to_string(static_cast<int>(softcap));
  if (sinks) d += " sinks";
  return d;
}

// The FP8 operands of one problem, in their own device buffers; Q and K in `qk` (e4m3 or s8).
struct Fp8Buffers {
  DeviceBuffer q, k, vt, qs, ks, vs;
  warpattn::Fp8Operands ops;
  Fp8Buffers(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, warpattn::DType qk = warpattn::DType::e4m3)
      : q(b * sq * hq * d), k(b * sk * hkv * d), vt(b * hkv * d * warpattn::fp8_padded_keys(sk)),
        qs(b * hq * blocks_of(sq) * 4), ks(b * hkv * blocks_of(sk) * 4), vs(b * hkv * blocks_of(sk) * 4) {
    ops.q = contiguous(q.mem, qk, {b, sq, hq, d});
    ops.k = contiguous(k.mem, qk, {b, sk, hkv, d});
    ops.vt = contiguous(vt.mem, warpattn::DType::e4m3, {b, hkv, d, warpattn::fp8_padded_keys(sk)});
    ops.q_descale = contiguous(qs.mem, warpattn::DType::f32, {b, hq, blocks_of(sq)});
    ops.k_descale = contiguous(ks.mem, warpattn::DType::f32, {b, hkv, blocks_of(sk)});
    ops.v_descale = contiguous(vs.mem, warpattn::DType::f32, {b, hkv, blocks_of(sk)});
  }
};

// Scores that jump within a row: every Q element and every element of the first 128 keys
// of K set to 3, so those keys score 9 d x scale = 9 sqrt(d) nats (102 at d = 128, 144 at
// d = 256), far above the other keys (N(0, 9) nats). Keys are visited from the last tile to
// the first, so the row max jumps by more than fp32's exponent range (128 log2 units) when key
// tile 0 comes last: old O and row sums scale by 2^-147 or less, and a softmax that would
// exponentiate before knowing the tile's max would overflow.
inline void set_score_jump(DeviceTensor& q, DeviceTensor& k) {
  cudaDeviceSynchronize();
  const bool bf16 = q.view.dtype == warpattn::DType::bf16;
  const uint16_t three = bf16 ? warpattn::host::float_to_bf16(3.f) : warpattn::host::float_to_f16(3.f);
  auto set = [&](DeviceTensor& t, int64_t rows) {
    auto h = t.raw();
    const auto& v = t.view;
    for (int64_t b = 0; b < v.shape[0]; ++b)
      for (int64_t s = 0; s < std::min(rows, v.shape[1]); ++s)
        for (int64_t hh = 0; hh < v.shape[2]; ++hh)
          for (int64_t d = 0; d < v.shape[3]; ++d) h[b * v.stride[0] + s * v.stride[1] + hh * v.stride[2] + d] = three;
    t.upload(h);
  };
  set(q, q.view.shape[1]);
  set(k, 128);
}


// A device int32 array (rank 1; reshaped by the caller where it needs another rank): the
// offsets of packed batches, a KV cache's lengths and block table.
struct DeviceInts {
  int* mem = nullptr;
  warpattn::TensorView view;
  explicit DeviceInts(const std::vector<int>& h) {
    if (cudaMalloc(&mem, std::max<size_t>(h.size(), 1) * 4) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    if (!h.empty()) cudaMemcpy(mem, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    view.data = mem;
    view.dtype = warpattn::DType::s32;
    view.rank = 1;
    view.shape[0] = static_cast<int64_t>(h.size());
    view.stride[0] = 1;
  }
  ~DeviceInts() { cudaFree(mem); }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
};

}  // namespace gpu_test
