#include "api/device_scope.hpp"

#include <atomic>
#include <cstdint>
#include <string>

#include "api/message.hpp"
#include "api/problem.hpp"

namespace warpattn::detail {

namespace {

[[noreturn]] void fail(const Message& m) { throw Error(m.str()); }

[[noreturn]] void no_hopper(const std::string& why) {
  throw Error("no CUDA device with compute capability 9.0 (Hopper) found: " + why);
}

// A failed query leaves its error as the runtime's last error; clear it so that a caller who
// catches our Error does not meet it again from an unrelated, later cudaGetLastError.
[[noreturn]] void no_hopper_after(cudaError_t e, const char* call) {
  cudaGetLastError();
  no_hopper(std::string(call) + ": " + cudaGetErrorString(e));
}

[[noreturn]] void cuda_failed(cudaError_t e, const char* call) {
  cudaGetLastError();
  throw Error(std::string(call) + ": " + cudaGetErrorString(e));
}

// The device whose memory `v` is, or an Error naming the argument.
int device_of(const NamedView& t) {
  cudaPointerAttributes a{};
  if (cudaError_t e = cudaPointerGetAttributes(&a, t.view->data); e != cudaSuccess)
    cuda_failed(e, (std::string(t.name) + ": cudaPointerGetAttributes").c_str());
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return a.device;
  Message m;
  m << t.name << ": expected device memory, got "
    << (a.type == cudaMemoryTypeHost ? "page-locked host memory" : "an address CUDA does not know (host memory?)")
    << " at " << hex(reinterpret_cast<uintptr_t>(t.view->data));
  fail(m);
}

// The kernels are built for sm_90a only, and sm_90a code runs on compute capability 9.0 alone.
// A device found to be one is remembered (two runtime calls fewer per call: issue 16's host
// cost); one that is not is asked again, and refused, every time.
void require_sm90(int device) {
  static std::atomic<uint64_t> known_sm90{0};  // bit d: device d is sm_90 (past 63: asked every time)
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (known_sm90.load(std::memory_order_relaxed) & bit) != 0) return;
  int major = 0, minor = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device); e != cudaSuccess)
    no_hopper_after(e, "cudaDeviceGetAttribute");
  if (cudaError_t e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device); e != cudaSuccess)
    no_hopper_after(e, "cudaDeviceGetAttribute");
  if (major != 9 || minor != 0)
    no_hopper("found sm_" + std::to_string(major) + std::to_string(minor) + " (device " + std::to_string(device) +
              ", where the tensors are)");
  known_sm90.fetch_or(bit, std::memory_order_relaxed);
}

// `stream` must belong to `device`. The special handles (0, cudaStreamLegacy,
// cudaStreamPerThread) name the current device's streams, and the call makes the tensors'
// device current; any other stream has a device of its own, which CUDA will not tell while the
// stream is being captured: there the launch itself fails on a stream of another device
// (invalid resource handle).
void check_stream(cudaStream_t stream, int device) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
    cuda_failed(e, "stream: cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;
  int stream_device = device;
  if (cudaError_t e = cudaStreamGetDevice(stream, &stream_device); e != cudaSuccess)
    cuda_failed(e, "stream: cudaStreamGetDevice");
  if (stream_device == device) return;
  Message m;
  m << "stream: belongs to device " << stream_device << ", but the tensors are on device " << device;
  fail(m);
}

}  // namespace

DeviceScope::DeviceScope(std::span<const NamedView> tensors, cudaStream_t stream) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) no_hopper_after(e, "cudaGetDeviceCount");
  if (count == 0) no_hopper("cudaGetDeviceCount reported 0 devices");
  if (cudaError_t e = cudaGetDevice(&previous_); e != cudaSuccess) no_hopper_after(e, "cudaGetDevice");

  const NamedView* first = nullptr;
  device_ = previous_;  // a call with nothing to touch stays where it is
  for (const NamedView& t : tensors) {
    if (t.view == nullptr || is_empty(*t.view)) continue;
    const int d = device_of(t);
    if (first == nullptr) {
      first = &t;
      device_ = d;
    } else if (d != device_) {
      Message m;
      m << t.name << ": on device " << d << ", but " << first->name << " is on device " << device_
        << " (every tensor of a call must be on one device)";
      fail(m);
    }
  }
  require_sm90(device_);
  check_stream(stream, device_);
  // Last, so that a refused call leaves the caller's device current.
  if (device_ != previous_)
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) cuda_failed(e, "cudaSetDevice");
}

DeviceScope::~DeviceScope() {
  if (device_ != previous_) cudaSetDevice(previous_);
}

}  // namespace warpattn::detail
