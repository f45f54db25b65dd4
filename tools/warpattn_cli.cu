// warpattn: the command-line tool.
//
// Its default run is the source article's benchmark: B=1, H=16, N=16384, d=128, for BF16 and
// FP16, causal and not. Each configuration is first checked against the fp64 reference on
// sampled rows (so a fast wrong kernel can never print a good number), then timed with CUDA
// events, and set beside the dense cuBLAS GEMM rate measured in the same run, because the
// card's power limit moves every absolute figure and only in-run ratios compare across days.
//
// It uses only the public API (warpattn/warpattn.hpp) for attention, like any user would.
//
// Exit codes: 0 every configuration passed; 1 a check failed or a CUDA/cuBLAS/warpattn call
// failed; 2 no Hopper GPU; 64 bad command line.

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/host_float16.hpp"
#include "reference/reference.hpp"
#include "warpattn/warpattn.hpp"

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitNoHopper = 2;
constexpr int kExitUsage = 64;  // EX_USAGE: keeps "bad flags" apart from "no GPU"

// The cuBLAS ceiling: the size the anchors use (docs/perf/anchors.md).
constexpr int kGemmSize = 8192;

// ------------------------------------------------------------------------------------------
// Errors. A CUDA or cuBLAS failure becomes an exception naming the call and where it was made;
// the caller decides whether it ends one configuration or the whole run.

struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  std::ostringstream os;
  os << call << " failed at " << file << ":" << line << ": " << cudaGetErrorName(status) << " ("
     << cudaGetErrorString(status) << ")";
  throw CudaFailure(os.str());
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::ostringstream os;
  os << call << " failed at " << file << ":" << line << ": " << cublasGetStatusName(status) << " ("
     << cublasGetStatusString(status) << ")";
  throw CudaFailure(os.str());
}

#define CUDA_CHECK(call) check_cuda((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

// ------------------------------------------------------------------------------------------
// Command line.

struct Options {
  int64_t batch = 1;
  int64_t heads = 16;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t seqlen_q = 16384;
  int64_t seqlen_k = 0;  // 0: same as seqlen_q
  int64_t head_dim = 128;
  std::vector<warpattn::DType> dtypes = {warpattn::DType::bf16, warpattn::DType::f16};
  std::vector<bool> causal = {false, true};
  int iters = 30;       // timed launches per configuration; the median is reported
  int warmup = 10;      // untimed launches first: clocks, caches and lazy loading settle
  int check_rows = 16;  // sampled query rows per (batch, head) checked against fp64
  std::optional<uint64_t> seed;
  std::string json_path;
  float softcap = 0;  // > 0: Gemma 2's logit soft cap (ForwardOptions::softcap), checked and timed
  int64_t window_left = -1;  // >= 0: a sliding window (ForwardOptions::window_left), checked and timed
};

void print_usage(FILE* to) {
  std::fprintf(to,
               "usage: warpattn [options]\n"
               "\n"
               "Checks warpattn's forward pass against an fp64 reference on sampled rows, then\n"
               "times it (median of CUDA-event-timed launches) beside the cuBLAS %dx%dx%d GEMM\n"
               "rate measured in the same run. Default: the source article's configuration,\n"
               "B=1 H=16 N=16384 d=128, bf16 and fp16, causal and not.\n"
               "\n"
               "  --batch N          batch size (default 1)\n"
               "  --heads N          query heads (default 16)\n"
               "  --kv-heads N       key/value heads, divides --heads (default: --heads)\n"
               "  --seqlen-q N       query length (default 16384)\n"
               "  --seqlen-k N       key/value length (default: --seqlen-q)\n"
               "  --head-dim N       64, 128 or 256 (default 128)\n"
               "  --dtype D          bf16 | fp16 | both (default both)\n"
               "  --causal C         0 | 1 | both (default both); bottom-right aligned\n"
               "  --iters N          timed launches per configuration (default 30)\n"
               "  --warmup N         untimed launches before timing (default 10)\n"
               "  --check-rows N     query rows checked per (batch, head) (default 16)\n"
               "  --seed N           random seed (default: from the clock; printed)\n"
               "  --softcap X        soft-cap the logits at X > 0 (default 0: off)\n"
               "  --window-left N    a sliding window: each row sees N keys left of its diagonal\n"
               "                     (FlashAttention's window_size=(N, -1), or (N, 0) with causal;\n"
               "                     default -1: unbounded); TFLOP/s count the in-window work\n"
               "  --json PATH        also write the results as JSON to PATH\n"
               "  -h, --help         this text\n"
               "\n"
               "Fails (exit 1) if a relative L2 error exceeds 5e-3 (bf16) / 1e-3 (fp16), the LSE\n"
               "error exceeds 1e-4, or any output is NaN/Inf. Exit 2: no Hopper GPU.\n",
               kGemmSize, kGemmSize, kGemmSize);
}

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min_value) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw UsageError(flag + ": expected an integer, got '" + text + "'");
  }
  if (value < min_value) {
    throw UsageError(flag + ": expected at least " + std::to_string(min_value) + ", got " + text);
  }
  return value;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      print_usage(stdout);
      std::exit(0);
    }
    // Accept both "--flag value" and "--flag=value".
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) throw UsageError(arg + ": expected a value");
      return argv[++i];
    };
    if (arg == "--batch") {
      o.batch = parse_int(arg, next(), 1);
    } else if (arg == "--heads") {
      o.heads = parse_int(arg, next(), 1);
    } else if (arg == "--kv-heads") {
      o.kv_heads = parse_int(arg, next(), 1);
    } else if (arg == "--seqlen-q") {
      o.seqlen_q = parse_int(arg, next(), 1);
    } else if (arg == "--seqlen-k") {
      o.seqlen_k = parse_int(arg, next(), 1);
    } else if (arg == "--head-dim") {
      o.head_dim = parse_int(arg, next(), 1);
    } else if (arg == "--dtype") {
      const std::string d = next();
      if (d == "bf16") {
        o.dtypes = {warpattn::DType::bf16};
      } else if (d == "fp16") {
        o.dtypes = {warpattn::DType::f16};
      } else if (d == "both") {
        o.dtypes = {warpattn::DType::bf16, warpattn::DType::f16};
      } else {
        throw UsageError("--dtype: expected bf16, fp16 or both, got '" + d + "'");
      }
    } else if (arg == "--causal") {
      const std::string c = next();
      if (c == "0") {
        o.causal = {false};
      } else if (c == "1") {
        o.causal = {true};
      } else if (c == "both") {
        o.causal = {false, true};
      } else {
        throw UsageError("--causal: expected 0, 1 or both, got '" + c + "'");
      }
    } else if (arg == "--iters") {
      o.iters = static_cast<int>(std::min<int64_t>(parse_int(arg, next(), 1), 1 << 20));
    } else if (arg == "--warmup") {
      o.warmup = static_cast<int>(std::min<int64_t>(parse_int(arg, next(), 0), 1 << 20));
    } else if (arg == "--check-rows") {
      o.check_rows = static_cast<int>(std::min<int64_t>(parse_int(arg, next(), 1), 1 << 20));
    } else if (arg == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(arg, next(), 0));
    } else if (arg == "--softcap") {
      const std::string text = next();
      size_t used = 0;
      float value = -1;
      try {
        value = std::stof(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != text.size() || !(value >= 0) || !std::isfinite(value))
        throw UsageError("--softcap: expected a finite number >= 0, got '" + text + "'");
      o.softcap = value;
    } else if (arg == "--window-left") {
      o.window_left = std::min<int64_t>(parse_int(arg, next(), -1), 1 << 30);
    } else if (arg == "--json") {
      o.json_path = next();
      if (o.json_path.empty()) throw UsageError("--json: expected a path");
    } else {
      throw UsageError("unknown option '" + std::string(argv[i]) + "' (see --help)");
    }
  }
  if (o.kv_heads == 0) o.kv_heads = o.heads;
  if (o.seqlen_k == 0) o.seqlen_k = o.seqlen_q;
  if (o.heads % o.kv_heads != 0) {
    throw UsageError("--kv-heads: expected a divisor of --heads (" + std::to_string(o.heads) +
                     "), got " + std::to_string(o.kv_heads));
  }
  return o;
}

// ------------------------------------------------------------------------------------------
// The device: a Hopper (compute capability 9.0) GPU, or a plain message and exit 2.

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0, sms = 0;
  int driver_version = 0, runtime_version = 0;
};

std::optional<DeviceInfo> find_hopper(std::string* reason) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    *reason = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return std::nullopt;
  }
  if (count == 0) {
    *reason = "no CUDA device visible";
    return std::nullopt;
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) {
    *reason = std::string("cudaGetDeviceProperties(0): ") + cudaGetErrorString(e);
    return std::nullopt;
  }
  if (prop.major != 9) {
    *reason = "device 0 is " + std::string(prop.name) + " (compute capability " +
              std::to_string(prop.major) + "." + std::to_string(prop.minor) + ")";
    return std::nullopt;
  }
  DeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.sms = prop.multiProcessorCount;
  CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  return info;
}

// ------------------------------------------------------------------------------------------
// Device memory and events, released on every path (a failed configuration must not leak the
// ~200 MB the next one needs).

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// ------------------------------------------------------------------------------------------
// Random N(0,1) inputs, generated on the device: a counter-based hash (splitmix64's finaliser
// over seed + index) feeding Box–Muller. Counter-based, so every element is independent of the
// launch shape and a printed seed reproduces the data exactly.

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

template <class T>
__global__ void fill_standard_normal(T* dst, int64_t n, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint64_t bits = splitmix64(seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull);
    // Two 24-bit uniforms; u1 in (0, 1] so the logarithm is finite.
    const float u1 = static_cast<float>((bits >> 40) + 1) * 0x1p-24f;
    const float u2 = static_cast<float>(bits & 0xFFFFFFull) * 0x1p-24f;
    const float radius = sqrtf(-2.f * logf(u1));
    dst[i] = from_float<T>(radius * cospif(2.f * u2));
  }
}

void fill_random(void* dst, warpattn::DType dtype, int64_t n, uint64_t seed, cudaStream_t stream) {
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65536));
  if (dtype == warpattn::DType::bf16) {
    fill_standard_normal<<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), n, seed);
  } else if (dtype == warpattn::DType::f16) {
    fill_standard_normal<<<blocks, threads, 0, stream>>>(static_cast<__half*>(dst), n, seed);
  } else {
    throw std::logic_error("fill_random: only bf16 and fp16");
  }
  CUDA_CHECK(cudaGetLastError());
}

// A distinct seed per (configuration, tensor), all derived from the one the user sees.
uint64_t derive_seed(uint64_t base, uint64_t config, uint64_t tensor) {
  return splitmix64(splitmix64(base ^ (config << 8)) ^ tensor);
}

// ------------------------------------------------------------------------------------------
// Timing: one event pair around each launch, the median over the launches. The median, not the
// mean, because the power-limited card throttles in bursts and one slow launch should not move
// the figure.

template <class Launch>
std::vector<float> time_each_launch(Launch&& launch, int warmup, int iters, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) launch();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<Event> starts(iters), stops(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(starts[i].get(), stream));
    launch();
    CUDA_CHECK(cudaEventRecord(stops[i].get(), stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventElapsedTime(&ms[i], starts[i].get(), stops[i].get()));
  }
  return ms;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (static_cast<double>(v[n / 2 - 1]) + v[n / 2]);
}

// ------------------------------------------------------------------------------------------
// The ceiling: cuBLAS GEMM, 8192^3, fp16/bf16 in and out, fp32 accumulation (what torch.matmul
// does), on random data (zeros would let the tensor cores draw less power and run faster).

double measure_gemm_tflops(warpattn::DType dtype, int warmup, int iters, uint64_t seed,
                           cudaStream_t stream) {
  const int64_t n = kGemmSize;
  const size_t bytes = static_cast<size_t>(n * n) * 2;
  DeviceBuffer a(bytes), b(bytes), c(bytes);
  fill_random(a.get(), dtype, n * n, derive_seed(seed, 0xFFFF, 0), stream);
  fill_random(b.get(), dtype, n * n, derive_seed(seed, 0xFFFF, 1), stream);

  cublasHandle_t handle = nullptr;
  CUBLAS_CHECK(cublasCreate(&handle));
  struct HandleGuard {
    cublasHandle_t h;
    ~HandleGuard() { cublasDestroy(h); }
  } guard{handle};
  CUBLAS_CHECK(cublasSetStream(handle, stream));

  const cudaDataType_t type = dtype == warpattn::DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.f, beta = 0.f;
  const int m = static_cast<int>(n);
  auto launch = [&] {
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, a.get(), type, m,
                              b.get(), type, m, &beta, c.get(), type, m, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  };
  const double ms = median(time_each_launch(launch, warmup, iters, stream));
  return 2.0 * static_cast<double>(n) * n * n / (ms * 1e-3) / 1e12;
}

// ------------------------------------------------------------------------------------------
// One configuration.

struct Config {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  warpattn::DType dtype;
  bool causal;
  float softcap;
  int64_t window_left;
};

struct Result {
  Config config{};
  bool ran = false;  // false: an error stopped it before timing
  double ms = NAN, ms_min = NAN, ms_max = NAN, tflops = NAN, gemm_tflops = NAN;
  double rel_l2 = NAN, max_abs = NAN, lse_max_abs = NAN;
  int64_t nonfinite_out = 0, unwritten_lse = 0, rows_checked = 0;
  bool pass = false;
  std::string error;
};

const char* short_name(warpattn::DType d) { return d == warpattn::DType::bf16 ? "bf16" : "fp16"; }
const char* torch_name(warpattn::DType d) {
  return d == warpattn::DType::bf16 ? "bfloat16" : "float16";
}
double rel_l2_limit(warpattn::DType d) { return d == warpattn::DType::bf16 ? 5e-3 : 1e-3; }
constexpr double kLseLimit = 1e-4;

// The configuration as the fp64 reference reads it (its mask, scale and soft cap; the FLOP count
// below counts its visible pairs).
warpattn::reference::AttentionShape reference_shape(const Config& c) {
  warpattn::reference::AttentionShape shape{};
  shape.batch = c.batch;
  shape.seqlen_q = c.seqlen_q;
  shape.seqlen_k = c.seqlen_k;
  shape.heads_q = c.heads_q;
  shape.heads_kv = c.heads_kv;
  shape.head_dim = c.head_dim;
  // The library's default scale, computed as it is documented (in float).
  shape.softmax_scale = static_cast<double>(1.f / std::sqrt(static_cast<float>(c.head_dim)));
  shape.causal = c.causal;
  shape.softcap = c.softcap;
  shape.window_left = c.window_left;
  return shape;
}

// The configuration as the library's forward takes it (checked and timed calls alike).
warpattn::ForwardOptions forward_options(const Config& c) {
  warpattn::ForwardOptions options;
  options.causal = c.causal;
  options.softcap = c.softcap;
  options.window_left = static_cast<int>(c.window_left);
  return options;
}

// Forward FLOPs: 4·d per (query, key) pair the mask leaves, per batch and head. Without a mask
// that is 4·B·H·Nq·Nk·d. With the bottom-right causal mask, query i sees keys j <= i + Nk - Nq,
// so the pairs are counted row by row: (Nq² + Nq)/2 when Nq = Nk (the usual "halved" figure, to
// within 1/Nq), but far fewer for Nq > Nk and far more than half for Nq < Nk (halving
// overstated Nq = 16384, Nk = 1024 sixteenfold).
double forward_flops(const Config& c) {
  return 4.0 * c.batch * c.heads_q * warpattn::reference::visible_pairs(reference_shape(c)) * c.head_dim;
}

float to_float(uint16_t bits, warpattn::DType d) {
  return d == warpattn::DType::bf16 ? warpattn::host::bf16_to_float(bits)
                                    : warpattn::host::f16_to_float(bits);
}

// Copies a device tensor of 16-bit elements to the host as floats.
std::vector<float> download_as_float(const DeviceBuffer& buf, int64_t n, warpattn::DType d) {
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(raw.data(), buf.get(), raw.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = to_float(raw[i], d);
  return out;
}

// The rows checked per (batch, head): the first, the last, and random others (distinct);
// every row when the sequence is short.
std::vector<int64_t> sample_rows(int64_t seqlen, int count, std::mt19937_64& rng) {
  std::vector<int64_t> rows;
  if (seqlen <= count) {
    for (int64_t r = 0; r < seqlen; ++r) rows.push_back(r);
    return rows;
  }
  rows = {0, seqlen - 1};
  std::uniform_int_distribution<int64_t> pick(1, seqlen - 2);
  while (static_cast<int>(rows.size()) < count) {
    const int64_t r = pick(rng);
    if (std::find(rows.begin(), rows.end(), r) == rows.end()) rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

struct RowTask {
  int64_t b, h, row;
};

// Runs the fp64 reference for every sampled row on all host cores: 16 rows x 16 heads of a
// 16k-key attention is ~1 GFLOP of doubles, a second on one core, per configuration.
void run_reference(const warpattn::reference::AttentionShape& shape, const std::vector<float>& q,
                   const std::vector<float>& k, const std::vector<float>& v,
                   const std::vector<RowTask>& tasks, std::vector<double>& ref_out,
                   std::vector<double>& ref_lse) {
  const int64_t d = shape.head_dim;
  ref_out.assign(tasks.size() * d, 0.0);
  ref_lse.assign(tasks.size(), 0.0);
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (size_t i = next++; i < tasks.size() && !failed; i = next++) {
      try {
        warpattn::reference::attention_row(shape, q.data(), k.data(), v.data(), tasks[i].b,
                                           tasks[i].h, tasks[i].row, &ref_out[i * d], &ref_lse[i]);
      } catch (...) {
        if (!failed.exchange(true)) failure = std::current_exception();
      }
    }
  };
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min<size_t>(hw, std::max<size_t>(tasks.size(), 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

// Fills q, k, v with fresh data, poisons out and lse, runs one forward with LSE, and compares
// the sampled rows with the fp64 reference. Also counts NaN/Inf anywhere in out: the poison
// (0xFF bytes = NaN) left in any element the kernel forgot to write shows up there.
void check_configuration(const Config& c, const DeviceBuffer& q, const DeviceBuffer& k,
                         const DeviceBuffer& v, const DeviceBuffer& out, const DeviceBuffer& lse,
                         const warpattn::TensorView& qv, const warpattn::TensorView& kv,
                         const warpattn::TensorView& vv, const warpattn::TensorView& ov,
                         const warpattn::TensorView& lv, int rows_per_head, uint64_t seed,
                         cudaStream_t stream, Result& r) {
  CUDA_CHECK(cudaMemsetAsync(out.get(), 0xFF, out.bytes(), stream));
  CUDA_CHECK(cudaMemsetAsync(lse.get(), 0xFF, lse.bytes(), stream));
  warpattn::forward(qv, kv, vv, ov, lv, forward_options(c), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));

  const int64_t q_elems = c.batch * c.seqlen_q * c.heads_q * c.head_dim;
  const int64_t kv_elems = c.batch * c.seqlen_k * c.heads_kv * c.head_dim;
  const std::vector<float> hq = download_as_float(q, q_elems, c.dtype);
  const std::vector<float> hk = download_as_float(k, kv_elems, c.dtype);
  const std::vector<float> hv = download_as_float(v, kv_elems, c.dtype);
  const std::vector<float> ho = download_as_float(out, q_elems, c.dtype);
  std::vector<float> hl(static_cast<size_t>(c.batch * c.heads_q * c.seqlen_q));
  CUDA_CHECK(cudaMemcpy(hl.data(), lse.get(), hl.size() * sizeof(float), cudaMemcpyDeviceToHost));

  for (const float x : ho) r.nonfinite_out += !std::isfinite(x);
  // -inf is a legal LSE (a row with no visible key); NaN is the poison or a bug.
  for (const float x : hl) r.unwritten_lse += std::isnan(x);

  std::mt19937_64 rng(seed);
  std::vector<RowTask> tasks;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (const int64_t row : sample_rows(c.seqlen_q, rows_per_head, rng)) {
        tasks.push_back({b, h, row});
      }
    }
  }
  const warpattn::reference::AttentionShape shape = reference_shape(c);
  std::vector<double> ref_out, ref_lse;
  run_reference(shape, hq, hk, hv, tasks, ref_out, ref_lse);

  // Gather the sampled rows (and their LSE) in task order, beside the reference, and let the
  // reference's compare() judge them: it treats NaN as an infinite error and lets -inf (a row
  // with no visible key) match only -inf.
  const int64_t d = c.head_dim;
  std::vector<float> got_out(tasks.size() * d), got_lse(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    const RowTask& t = tasks[i];
    const float* row = &ho[((t.b * c.seqlen_q + t.row) * c.heads_q + t.h) * d];
    std::copy(row, row + d, &got_out[i * d]);
    got_lse[i] = hl[(t.b * c.heads_q + t.h) * c.seqlen_q + t.row];
  }
  const auto out_err = warpattn::reference::compare(got_out.data(), ref_out.data(),
                                                    static_cast<int64_t>(got_out.size()));
  const auto lse_err = warpattn::reference::compare(got_lse.data(), ref_lse.data(),
                                                    static_cast<int64_t>(got_lse.size()));
  r.rows_checked = static_cast<int64_t>(tasks.size());
  r.rel_l2 = out_err.rel_l2;
  r.max_abs = out_err.max_abs;
  r.lse_max_abs = lse_err.max_abs;
}

Result run_configuration(const Config& c, const Options& o, uint64_t seed, uint64_t config_index,
                         double gemm_tflops, cudaStream_t stream) {
  Result r;
  r.config = c;
  r.gemm_tflops = gemm_tflops;
  try {
    const int64_t q_shape[4] = {c.batch, c.seqlen_q, c.heads_q, c.head_dim};
    const int64_t kv_shape[4] = {c.batch, c.seqlen_k, c.heads_kv, c.head_dim};
    const int64_t lse_shape[3] = {c.batch, c.heads_q, c.seqlen_q};
    const int64_t q_elems = q_shape[0] * q_shape[1] * q_shape[2] * q_shape[3];
    const int64_t kv_elems = kv_shape[0] * kv_shape[1] * kv_shape[2] * kv_shape[3];
    const size_t esize = static_cast<size_t>(warpattn::dtype_size(c.dtype));
    DeviceBuffer q(q_elems * esize), k(kv_elems * esize), v(kv_elems * esize);
    DeviceBuffer out(q_elems * esize),
        lse(static_cast<size_t>(c.batch * c.heads_q * c.seqlen_q) * 4);

    fill_random(q.get(), c.dtype, q_elems, derive_seed(seed, config_index, 1), stream);
    fill_random(k.get(), c.dtype, kv_elems, derive_seed(seed, config_index, 2), stream);
    fill_random(v.get(), c.dtype, kv_elems, derive_seed(seed, config_index, 3), stream);

    const auto qv = warpattn::make_contiguous_view(q.get(), c.dtype, 4, q_shape);
    const auto kv = warpattn::make_contiguous_view(k.get(), c.dtype, 4, kv_shape);
    const auto vv = warpattn::make_contiguous_view(v.get(), c.dtype, 4, kv_shape);
    const auto ov = warpattn::make_contiguous_view(out.get(), c.dtype, 4, q_shape);
    const auto lv = warpattn::make_contiguous_view(lse.get(), warpattn::DType::f32, 3, lse_shape);

    check_configuration(c, q, k, v, out, lse, qv, kv, vv, ov, lv, o.check_rows,
                        derive_seed(seed, config_index, 4), stream, r);

    // Timed without LSE: the plain inference forward, as PyTorch's SDPA anchors run it.
    const warpattn::ForwardOptions options = forward_options(c);
    auto launch = [&] { warpattn::forward(qv, kv, vv, ov, std::nullopt, options, stream); };
    const std::vector<float> ms = time_each_launch(launch, o.warmup, o.iters, stream);
    r.ms = median(ms);
    r.ms_min = *std::min_element(ms.begin(), ms.end());
    r.ms_max = *std::max_element(ms.begin(), ms.end());
    r.tflops = forward_flops(c) / (r.ms * 1e-3) / 1e12;
    r.ran = true;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  r.pass = r.ran && r.error.empty() && r.nonfinite_out == 0 && r.unwritten_lse == 0 &&
           r.rel_l2 <= rel_l2_limit(c.dtype) && r.lse_max_abs <= kLseLimit;
  return r;
}

// ------------------------------------------------------------------------------------------
// Output.

std::string format_number(double x, const char* fmt) {
  if (!std::isfinite(x)) return std::isnan(x) ? "n/a" : "inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

void print_table(const std::vector<Result>& results) {
  std::printf("\n%-5s %-6s %9s %9s %7s %9s %10s %9s  %s\n", "dtype", "causal", "ms", "TFLOP/s",
              "/GEMM", "rel L2", "max|err|", "LSE err", "result");
  for (const Result& r : results) {
    std::printf("%-5s %-6s %9s %9s %7s %9s %10s %9s  %s\n", short_name(r.config.dtype),
                r.config.causal ? "yes" : "no", format_number(r.ms, "%.3f").c_str(),
                format_number(r.tflops, "%.1f").c_str(),
                format_number(r.tflops / r.gemm_tflops, "%.3f").c_str(),
                format_number(r.rel_l2, "%.2e").c_str(), format_number(r.max_abs, "%.2e").c_str(),
                format_number(r.lse_max_abs, "%.2e").c_str(), r.pass ? "PASS" : "FAIL");
  }
  for (const Result& r : results) {
    if (r.pass) continue;
    std::printf("FAIL %s causal=%d:", short_name(r.config.dtype), r.config.causal ? 1 : 0);
    if (!r.error.empty()) std::printf(" error: %s;", r.error.c_str());
    if (r.nonfinite_out)
      std::printf(" %lld NaN/Inf outputs;", static_cast<long long>(r.nonfinite_out));
    if (r.unwritten_lse)
      std::printf(" %lld NaN LSE entries;", static_cast<long long>(r.unwritten_lse));
    if (r.rel_l2 > rel_l2_limit(r.config.dtype)) {
      std::printf(" rel L2 %.3e > %.0e;", r.rel_l2, rel_l2_limit(r.config.dtype));
    }
    if (r.lse_max_abs > kLseLimit) std::printf(" LSE error %.3e > %.0e;", r.lse_max_abs, kLseLimit);
    std::printf("\n");
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// JSON has no NaN or Infinity: unmeasured values are null.
std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void write_json(const std::string& path, const DeviceInfo& dev, const Options& o, uint64_t seed,
                const std::vector<std::pair<warpattn::DType, double>>& gemm,
                const std::vector<Result>& results) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("--json: cannot open '" + path + "' for writing");
  f << "{\n";
  f << "  \"tool\": \"warpattn\",\n";
  f << "  \"date\": " << json_string(utc_timestamp()) << ",\n";
  f << "  \"device\": {\"name\": " << json_string(dev.name) << ", \"compute_capability\": \""
    << dev.major << "." << dev.minor << "\", \"sms\": " << dev.sms
    << ", \"cuda_driver_version\": " << dev.driver_version
    << ", \"cuda_runtime_version\": " << dev.runtime_version << "},\n";
  f << "  \"seed\": " << seed << ",\n";
  std::string method = "median of " + std::to_string(o.iters) + " CUDA-event-timed launches";
  method += " after " + std::to_string(o.warmup) + " warm-up launches; fresh N(0,1) inputs;";
  method += " forward FLOPs 4*B*H*d per unmasked (query, key) pair (Nq*Nk, causal: counted row by row);";
  method += " timed without LSE; checked";
  method += " with LSE against an fp64 reference on " + std::to_string(o.check_rows);
  method += " sampled rows per (batch, head)";
  f << "  \"method\": " << json_string(method) << ",\n";
  f << "  \"ceilings\": {";
  for (size_t i = 0; i < gemm.size(); ++i) {
    f << (i ? ", " : "") << "\"cublas_" << short_name(gemm[i].first) << "_gemm_" << kGemmSize
      << "\": " << json_number(gemm[i].second);
  }
  f << "},\n";
  f << "  \"rows\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const Config& c = r.config;
    f << "    {\"impl\": \"warpattn\", \"dtype\": \"" << torch_name(c.dtype)
      << "\", \"B\": " << c.batch << ", \"H\": " << c.heads_q << ", \"H_kv\": " << c.heads_kv
      << ", \"N\": " << c.seqlen_q << ", \"N_k\": " << c.seqlen_k << ", \"d\": " << c.head_dim
      << ", \"causal\": " << (c.causal ? "true" : "false") << ", \"softcap\": " << c.softcap
      << ", \"window_left\": " << c.window_left
      << ", \"pass\": \"fwd\""
      << ", \"ms\": " << json_number(r.ms) << ", \"ms_min\": " << json_number(r.ms_min)
      << ", \"ms_max\": " << json_number(r.ms_max) << ", \"tflops\": " << json_number(r.tflops)
      << ", \"gemm_tflops\": " << json_number(r.gemm_tflops)
      << ", \"fraction_of_gemm\": " << json_number(r.tflops / r.gemm_tflops)
      << ", \"rel_l2\": " << json_number(r.rel_l2) << ", \"max_abs\": " << json_number(r.max_abs)
      << ", \"lse_max_abs\": " << json_number(r.lse_max_abs)
      << ", \"rows_checked\": " << r.rows_checked << ", \"nonfinite_out\": " << r.nonfinite_out
      << ", \"nan_lse\": " << r.unwritten_lse << ", \"check\": \"" << (r.pass ? "PASS" : "FAIL")
      << "\", \"error\": " << (r.error.empty() ? "null" : json_string(r.error)) << "}"
      << (i + 1 < results.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
  f.close();
  if (!f) throw std::runtime_error("--json: writing '" + path + "' failed");
}

int run(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "warpattn: %s\n", e.what());
    return kExitUsage;
  }

  std::string reason;
  const std::optional<DeviceInfo> dev = find_hopper(&reason);
  if (!dev) {
    std::fprintf(stderr, "warpattn: no Hopper GPU (compute capability 9.0) found: %s\n",
                 reason.c_str());
    return kExitNoHopper;
  }
  CUDA_CHECK(cudaSetDevice(0));

  const uint64_t seed = o.seed.value_or(
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()));
  std::printf("warpattn on %s (sm_%d%d, %d SMs), CUDA driver %d, runtime %d\n", dev->name.c_str(),
              dev->major, dev->minor, dev->sms, dev->driver_version, dev->runtime_version);
  std::printf(
      "B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld d=%lld; %d timed launches after %d "
      "warm-up; %d rows/head checked; seed %llu\n",
      static_cast<long long>(o.batch), static_cast<long long>(o.heads),
      static_cast<long long>(o.kv_heads), static_cast<long long>(o.seqlen_q),
      static_cast<long long>(o.seqlen_k), static_cast<long long>(o.head_dim), o.iters, o.warmup,
      o.check_rows, static_cast<unsigned long long>(seed));
  if (o.softcap > 0) std::printf("softcap %g\n", o.softcap);
  if (o.window_left >= 0) std::printf("window_left %lld\n", static_cast<long long>(o.window_left));
  std::fflush(stdout);

  Stream stream;
  std::vector<std::pair<warpattn::DType, double>> gemm;
  std::vector<Result> results;
  bool gemm_failed = false;
  uint64_t config_index = 0;
  for (const warpattn::DType dtype : o.dtypes) {
    // The GEMM ceiling right before its dtype's attention runs, at the same clocks and heat.
    double gemm_rate = NAN;
    try {
      gemm_rate = measure_gemm_tflops(dtype, o.warmup, std::max(o.iters, 20), seed, stream.get());
      std::printf("cuBLAS %s GEMM %dx%dx%d (fp32 accumulate): %.1f TFLOP/s\n", short_name(dtype),
                  kGemmSize, kGemmSize, kGemmSize, gemm_rate);
    } catch (const std::exception& e) {
      gemm_failed = true;
      std::printf("cuBLAS %s GEMM failed: %s\n", short_name(dtype), e.what());
    }
    gemm.emplace_back(dtype, gemm_rate);
    std::fflush(stdout);
    for (const bool causal : o.causal) {
      const Config c{o.batch,    o.heads,    o.kv_heads, o.seqlen_q,
                     o.seqlen_k, o.head_dim, dtype,      causal,     o.softcap, o.window_left};
      results.push_back(run_configuration(c, o, seed, ++config_index, gemm_rate, stream.get()));
      const Result& r = results.back();
      std::printf("  %s causal=%d: %s\n", short_name(dtype), causal ? 1 : 0,
                  r.error.empty() ? (r.pass ? "PASS" : "FAIL") : r.error.c_str());
      std::fflush(stdout);
    }
  }
  print_table(results);

  if (!o.json_path.empty()) {
    write_json(o.json_path, *dev, o, seed, gemm, results);
    std::printf("results written to %s\n", o.json_path.c_str());
  }
  const bool all_pass =
      std::all_of(results.begin(), results.end(), [](const Result& r) { return r.pass; });
  return all_pass && !gemm_failed ? 0 : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warpattn: error: %s\n", e.what());
    return kExitFailed;
  }
}
