// Where a call runs, and what it shares. GPU tests of
//   - device placement: a call runs on the device its tensors live on, whatever device is
//     current (needs two GPUs; skipped with the reason on one), refuses tensors on two devices,
//     a stream of another device, and host memory, before anything runs;
//   - concurrency: launches that run at the same time (two host threads on cudaStreamPerThread,
//     two CUDA graphs replayed at once on two streams) give the bits of the same calls made one
//     after the other on one stream (each launch has scheduler memory of its own).
// Fresh random data on every run; outputs poisoned before each call.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_support.cuh"
#include "reference/reference.hpp"
#include "warpattn/fp8.hpp"

using gpu_test::contiguous;
using gpu_test::DeviceBuffer;
using gpu_test::DeviceTensor;
using gpu_test::Fp8Buffers;
using warpattn::DType;

namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define REQUIRE_TWO_HOPPERS()                                                                      \
  do {                                                                                             \
    REQUIRE_HOPPER();                                                                              \
    if (device_count() < 2) SKIP("needs two GPUs, found " + std::to_string(device_count()));      \
    int major_ = 0;                                                                                \
    cudaDeviceGetAttribute(&major_, cudaDevAttrComputeCapabilityMajor, 1);                         \
    if (major_ != 9) SKIP("device 1 is not an sm_90 GPU");                                        \
  } while (0)

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const warpattn::Error& e) {
    return e.what();
  }
  return "";
}

int current_device() {
  int d = -1;
  cudaGetDevice(&d);
  return d;
}

// One attention problem's tensors on the current device, filled and with out poisoned.
struct Problem {
  DeviceTensor q, k, v, out;
  DeviceBuffer lse;
  Problem(int64_t b, int64_t s, int64_t h, int64_t d, uint64_t seed)
      : q(DType::bf16, b, s, h, d, false), k(DType::bf16, b, s, h, d, false), v(DType::bf16, b, s, h, d, false),
        out(DType::bf16, b, s, h, d, false), lse(b * h * s * 4) {
    q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2);
    out.poison();
  }
  warpattn::TensorView lse_view() const {
    return contiguous(lse.mem, DType::f32, {q.view.shape[0], q.view.shape[2], q.view.shape[1]});
  }
  void run(cudaStream_t stream, bool causal = false) {
    warpattn::ForwardOptions o;
    o.causal = causal;
    warpattn::forward(q.view, k.view, v.view, out.view, lse_view(), o, stream);
  }
};

// More work tiles than SMs (the dynamic tile counter), non-causal with a partial last wave
// (the split tail's partial states): B 4, H 16, S 2040, d 128 -> 1024 tiles of 128 rows.
constexpr int64_t kB = 4, kS = 2040, kH = 16, kD = 128;

// ---------------------------------------------------------------- device placement

TEST(devices_call_runs_where_its_tensors_are) {
  REQUIRE_TWO_HOPPERS();
  const uint64_t seed = gpu_test::fresh_seed();
  CUDA_OK(cudaSetDevice(1));
  Problem small(1, 300, 2, 64, seed), big(kB, kS, kH, kD, seed + 10);
  small.run(nullptr);  // with device 1 current: the run every other one is compared with
  big.run(nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto small_ref = small.out.raw(), big_ref = big.out.raw();
  const auto big_lse_ref = big.lse.get<float>();

  // Against the fp64 reference, so that the comparison below is with a right answer.
  const auto qf = small.q.logical(small.q.raw()), kf = small.k.logical(small.k.raw()),
             vf = small.v.logical(small.v.raw());
  std::vector<double> want(qf.size());
  warpattn::reference::attention({1, 300, 300, 2, 2, 64, 0.125, false}, qf.data(), kf.data(), vf.data(), want.data(),
                                 nullptr);
  const auto got = small.out.logical(small_ref);
  const auto stats = warpattn::reference::compare(got.data(), want.data(), static_cast<int64_t>(got.size()));
  CHECK(stats.rel_l2 < 5e-3 && stats.nan_count == 0) << "rel L2 " << stats.rel_l2 << ", NaN " << stats.nan_count;

  // The same calls with device 0 current, on the legacy stream and on a stream of device 1.
  cudaStream_t s1;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  for (cudaStream_t stream : {cudaStream_t(nullptr), s1}) {
    CUDA_OK(cudaSetDevice(1));
    small.out.poison(), big.out.poison();
    CUDA_OK(cudaMemset(big.lse.mem, 0xFF, big.lse.bytes));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaSetDevice(0));
    small.run(stream);
    big.run(stream);
    CHECK(current_device() == 0) << "the caller's current device was not restored";
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    const char* which = stream ? "a stream of device 1" : "the legacy stream";
    CHECK(small.out.raw() == small_ref) << "small problem on " << which << ": other bits than with device 1 current";
    CHECK(big.out.raw() == big_ref) << "big problem on " << which << ": other bits than with device 1 current";
    CHECK(big.lse.get<float>() == big_lse_ref) << "big problem's LSE on " << which;
  }
  CUDA_OK(cudaSetDevice(1));
  cudaStreamDestroy(s1);
  CUDA_OK(cudaSetDevice(0));
}

TEST(devices_fp8_runs_where_its_tensors_are) {
  REQUIRE_TWO_HOPPERS();
  const uint64_t seed = gpu_test::fresh_seed();
  for (DType qk : {DType::e4m3, DType::s8}) {
    CUDA_OK(cudaSetDevice(1));
    Problem p(2, 1000, 4, 128, seed);
    Fp8Buffers f(2, 1000, 1000, 4, 4, 128, qk);
    warpattn::quantize_fp8(p.q.view, p.k.view, p.v.view, f.ops, {}, nullptr);
    warpattn::forward_fp8(f.ops, p.out.view, p.lse_view(), {}, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto ref = p.out.raw();
    const auto codes = f.q.get<uint8_t>();
    const auto ref_lse = p.lse.get<float>();
    // Sanity: the FP8 result is attention of the same inputs.
    DeviceTensor bf(DType::bf16, 2, 1000, 4, 128, false);
    warpattn::forward(p.q.view, p.k.view, p.v.view, bf.view, std::nullopt, {}, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto a = p.out.logical(ref), b = bf.logical(bf.raw());
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < a.size(); ++i) err2 += (a[i] - b[i]) * (a[i] - b[i]), ref2 += double(b[i]) * b[i];
    // E4M3 Q, K, P and V: ~5% (the benchmark's guard is 0.1); garbage would be ~1.
    CHECK(std::sqrt(err2 / ref2) < 0.1) << "FP8 vs BF16 rel L2 " << std::sqrt(err2 / ref2);

    CUDA_OK(cudaMemset(f.q.mem, 0xFF, f.q.bytes));
    p.out.poison();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaSetDevice(0));
    warpattn::quantize_fp8(p.q.view, p.k.view, p.v.view, f.ops, {}, nullptr);
    warpattn::forward_fp8(f.ops, p.out.view, p.lse_view(), {}, nullptr);
    CHECK(current_device() == 0);
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(f.q.get<uint8_t>() == codes) << "quantize_fp8 with device 0 current: other codes";
    CHECK(p.out.raw() == ref) << "forward_fp8 with device 0 current: other bits";
    CHECK(p.lse.get<float>() == ref_lse) << "forward_fp8 with device 0 current: other LSE";
  }
  CUDA_OK(cudaSetDevice(0));
}

TEST(devices_mixed_devices_and_foreign_streams_are_refused) {
  REQUIRE_TWO_HOPPERS();
  const uint64_t seed = gpu_test::fresh_seed();
  CUDA_OK(cudaSetDevice(1));
  Problem p1(1, 256, 2, 64, seed);
  CUDA_OK(cudaSetDevice(0));
  Problem p0(1, 256, 2, 64, seed);
  cudaStream_t s0;
  CUDA_OK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CUDA_OK(cudaDeviceSynchronize());

  std::string m = error_of([&] { warpattn::forward(p1.q.view, p0.k.view, p1.v.view, p1.out.view, std::nullopt, {}); });
  CHECK(m == "k: on device 0, but q is on device 1 (every tensor of a call must be on one device)") << m;
  m = error_of([&] { warpattn::forward(p1.q.view, p1.k.view, p1.v.view, p1.out.view, p0.lse_view(), {}); });
  CHECK(m.rfind("lse: on device 0, but q is on device 1", 0) == 0) << m;
  m = error_of([&] { p1.run(s0); });
  CHECK(m == "stream: belongs to device 0, but the tensors are on device 1") << m;
  CHECK(current_device() == 0) << "a refused call changed the current device";
  Fp8Buffers f(1, 256, 256, 2, 2, 64);
  m = error_of([&] { warpattn::quantize_fp8(p1.q.view, p1.k.view, p1.v.view, f.ops, {}, nullptr); });
  CHECK(m.rfind("fp8.q: on device 0, but q is on device 1", 0) == 0) << m;
  // Nothing ran: p1's output is still poisoned.
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaDeviceSynchronize());
  const auto raw = p1.out.raw();
  CHECK(std::all_of(raw.begin(), raw.end(), [](uint16_t x) { return x == 0xFFFF; })) << "a refused call wrote out";
  CUDA_OK(cudaSetDevice(0));
  cudaStreamDestroy(s0);
}

// Host memory (malloc'd or page-locked) is refused by name before anything runs, on one GPU.
TEST(devices_host_memory_is_refused) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  Problem p(1, 256, 2, 64, seed);
  std::vector<uint16_t> host_out(256 * 2 * 64, 0xABCD);
  warpattn::TensorView out = p.out.view;
  out.data = host_out.data();
  std::string m = error_of([&] { warpattn::forward(p.q.view, p.k.view, p.v.view, out, std::nullopt, {}); });
  CHECK(m.rfind("out: expected device memory, got an address CUDA does not know (host memory?)", 0) == 0) << m;
  void* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, 256 * 2 * 4));
  std::memset(pinned, 0xCD, 256 * 2 * 4);
  const warpattn::TensorView lse = contiguous(pinned, DType::f32, {1, 2, 256});
  m = error_of([&] { warpattn::forward(p.q.view, p.k.view, p.v.view, p.out.view, lse, {}); });
  CHECK(m.rfind("lse: expected device memory, got page-locked host memory", 0) == 0) << m;
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(std::all_of(host_out.begin(), host_out.end(), [](uint16_t x) { return x == 0xABCD; }));
  const auto* bytes = static_cast<const uint8_t*>(pinned);
  CHECK(std::all_of(bytes, bytes + 256 * 2 * 4, [](uint8_t x) { return x == 0xCD; })) << "lse written";

  // FP8: descales in host memory, also when forward_fp8 is told not to read them back.
  Fp8Buffers f(1, 256, 256, 2, 2, 64);
  warpattn::quantize_fp8(p.q.view, p.k.view, p.v.view, f.ops, {}, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> host_descales(2 * 2, 1.f);
  warpattn::Fp8Operands ops = f.ops;
  ops.k_descale.data = host_descales.data();
  for (bool check : {true, false}) {
    m = error_of([&] { warpattn::forward_fp8(ops, p.out.view, std::nullopt, {}, nullptr, check); });
    CHECK(m.rfind("k_descale: expected device memory", 0) == 0) << "check_descales " << check << ": " << m;
  }
  cudaFreeHost(pinned);
}

// quantize_fp8 with more than 65535 heads (and batches): the grid's y and z limits.
TEST(devices_quantize_beyond_65535_heads_and_batches) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  for (auto [b, h] : {std::pair<int64_t, int64_t>{1, 70000}, {70000, 1}}) {
    DeviceTensor q(DType::bf16, b, 3, h, 64, false), k(DType::bf16, b, 3, h, 64, false),
        v(DType::bf16, b, 3, h, 64, false);
    q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2);
    Fp8Buffers f(b, 3, 3, h, h, 64);
    warpattn::quantize_fp8(q.view, k.view, v.view, f.ops, {}, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    // Every descale written (the poison 0xFFFFFFFF is NaN) and positive; so is every Vᵀ row.
    int64_t bad = 0;
    for (const DeviceBuffer* d : {&f.qs, &f.ks, &f.vs})
      for (float x : d->get<float>()) bad += !(x > 0.f && std::isfinite(x));
    const auto vt = f.vt.get<uint8_t>();  // keys 3..15 of each row are zero padding
    for (size_t row = 0; row < vt.size() / 16; ++row) bad += vt[row * 16 + 15] != 0;
    CHECK(bad == 0) << "B " << b << " H " << h << ": " << bad << " descales or Vt rows not written";
  }
}

// ---------------------------------------------------------------- concurrency

// Two host threads, each on its own per-thread default stream (one handle for both), each
// running its own problem several times: every result equals that problem's run alone.
TEST(concurrent_calls_on_per_thread_default_streams) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  Problem a(kB, kS, kH, kD, seed), b(kB, kS, kH, kD, seed + 100);
  a.run(nullptr), b.run(nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto a_ref = a.out.raw(), b_ref = b.out.raw();
  int mismatches[2] = {0, 0};
  // Everything on the thread's own stream: the legacy stream would serialise the two threads.
  auto worker = [&](Problem& p, const std::vector<uint16_t>& want, int& bad) {
    cudaSetDevice(0);
    std::vector<uint16_t> got(want.size());
    for (int i = 0; i < 12; ++i) {
      cudaMemsetAsync(p.out.mem, 0xFF, got.size() * 2, cudaStreamPerThread);
      p.run(cudaStreamPerThread);
      cudaMemcpyAsync(got.data(), p.out.mem, got.size() * 2, cudaMemcpyDeviceToHost, cudaStreamPerThread);
      cudaStreamSynchronize(cudaStreamPerThread);
      bad += got != want;
    }
  };
  std::thread ta(worker, std::ref(a), std::cref(a_ref), std::ref(mismatches[0]));
  std::thread tb(worker, std::ref(b), std::cref(b_ref), std::ref(mismatches[1]));
  ta.join(), tb.join();
  CUDA_OK(cudaGetLastError());
  CHECK(mismatches[0] == 0 && mismatches[1] == 0)
      << "runs that differ from the run alone: " << mismatches[0] << " and " << mismatches[1] << " of 12";
}

// Two graphs captured on one stream (each launch's scheduler memory is a graph memory node),
// replayed at the same time on two streams, again and again.
TEST(concurrent_graph_replays) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  for (bool causal : {false, true}) {
    Problem a(kB, kS, kH, kD, seed), b(kB, kS, kH, kD, seed + 100);
    // The fills and poison above ran on the legacy stream, which the non-blocking streams
    // below do not wait for (run 80's first version of this test compared against outputs
    // poisoned after they were written).
    CUDA_OK(cudaDeviceSynchronize());
    cudaStream_t capture, s1, s2;
    CUDA_OK(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    a.run(capture, causal), b.run(capture, causal);  // eager, on the stream the graphs are captured on
    CUDA_OK(cudaStreamSynchronize(capture));
    const auto a_ref = a.out.raw(), b_ref = b.out.raw();
    cudaGraphExec_t exec[2];
    Problem* problems[2] = {&a, &b};
    for (int g = 0; g < 2; ++g) {
      cudaGraph_t graph;
      CUDA_OK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
      problems[g]->run(capture, causal);
      CUDA_OK(cudaStreamEndCapture(capture, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec[g], graph, 0));
      cudaGraphDestroy(graph);
    }
    // How a replay's output differs from the eager run's: elements, and the largest difference.
    auto differ = [](const Problem& p, const std::vector<uint16_t>& want) {
      const auto got = p.out.logical(p.out.raw()), ref = p.out.logical(want);
      int64_t n = 0;
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != ref[i] && !(std::isnan(got[i]) && std::isnan(ref[i])))
          ++n, worst = gpu_test::worse(worst, std::fabs(double(got[i]) - ref[i]));
      return std::make_pair(n, worst);
    };
    // One after the other first (no concurrency), then at the same time.
    for (bool together : {false, true}) {
      int bad_a = 0, bad_b = 0;
      for (int i = 0; i < 10; ++i) {
        a.out.poison(), b.out.poison();
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaGraphLaunch(exec[0], s1));
        if (!together) CUDA_OK(cudaStreamSynchronize(s1));
        CUDA_OK(cudaGraphLaunch(exec[1], s2));
        CUDA_OK(cudaDeviceSynchronize());
        const auto da = differ(a, a_ref), db = differ(b, b_ref);
        if ((da.first || db.first) && bad_a + bad_b == 0)
          printf("    %s, %s: replay %d differs in %lld / %lld elements (largest %.3e / %.3e)\n",
                 causal ? "causal" : "full", together ? "together" : "one after the other", i, (long long)da.first,
                 (long long)db.first, da.second, db.second);
        bad_a += da.first > 0, bad_b += db.first > 0;
      }
      CHECK(bad_a == 0 && bad_b == 0) << (causal ? "causal" : "full") << (together ? ", together" : ", one after the other")
                                      << ": replays that differ from the eager run: " << bad_a << " and " << bad_b
                                      << " of 10";
    }
    for (auto e : exec) cudaGraphExecDestroy(e);
    for (auto s : {capture, s1, s2}) cudaStreamDestroy(s);
  }
}

}  // namespace

HARNESS_MAIN()
