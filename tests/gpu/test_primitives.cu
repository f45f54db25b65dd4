// GPU unit tests of the primitives the forward kernel stands on, through the kernel's own
// wrappers: a TMA tile load (rows past the end) and store, the mbarrier ring with producer and
// consumer roles, the S = Q·Kᵀ wgmma (both operands in shared memory, descriptor advance
// along K and across panels) and the O += P·V wgmma (P in registers from the S accumulator,
// V read MN-major), and the setmaxnreg split. Small-integer data makes every product exact,
// so the expected error is exactly zero. Every wait is bounded so a bug shows as a failure,
// not a hang.
#include <cuda_bf16.h>

#include <cstdio>

#include "gpu_test_support.cuh"
#include "hopper/consumer_gemms.cuh"
#include "hopper/forward_config.hpp"
#include "hopper/fragment.cuh"
#include "hopper/producer.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/panel_tile.cuh"
#include "hopper/tensor_map.hpp"

using namespace warpattn;
using namespace warpattn::detail;
using gpu_test::DeviceTensor;

namespace {

constexpr uint64_t kWaitNs = 500'000'000;  // 0.5 s

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// false after kWaitNs without the phase completing.
__device__ bool wait_bounded(uint32_t bar, uint32_t parity) {
  const uint64_t t0 = global_ns();
  while (!ptx::mbarrier_try_wait(bar, parity))
    if (global_ns() - t0 > kWaitNs) return false;
  return true;
}

// Small integers in [-2, 2] as bf16 bits, on the host.
std::vector<uint16_t> small_ints(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = host::float_to_bf16(static_cast<float>(static_cast<int>(rng() % 5) - 2));
  return v;
}
// Writes host values into the logical elements of a strided device tensor.
void upload(DeviceTensor& t, const std::vector<uint16_t>& logical) {
  auto raw = t.raw();
  const auto& v = t.view;
  int64_t i = 0;
  for (int64_t b = 0; b < v.shape[0]; ++b)
    for (int64_t s = 0; s < v.shape[1]; ++s)
      for (int64_t h = 0; h < v.shape[2]; ++h)
        for (int64_t d = 0; d < v.shape[3]; ++d) raw[b * v.stride[0] + s * v.stride[1] + h * v.stride[2] + d] = logical[i++];
  cudaMemcpy(t.mem, raw.data(), raw.size() * 2, cudaMemcpyHostToDevice);
}
float bf(uint16_t x) { return host::bf16_to_float(x); }

// ---------------------------------------------------------------- TMA load + store
template <int kRows, int kPanels>
__global__ void tma_roundtrip_kernel(const __grid_constant__ CUtensorMap in, const __grid_constant__ CUtensorMap out,
                                     int row0, int head, int batch, uint8_t* dump, int* status) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar;
  constexpr int kBytes = kRows * kPanels * 128;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(ptx::smem_addr(&bar), 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::mbarrier_arrive_expect_tx(ptx::smem_addr(&bar), kBytes);
    detail::load_panel_tile<kPanels, kRows, 128>(ptx::smem_addr(smem), &in, ptx::smem_addr(&bar), row0, head, batch);
  }
  const bool ok = __syncthreads_and(wait_bounded(ptx::smem_addr(&bar), 0));
  if (!ok) {
    if (threadIdx.x == 0) *status = 2;
    return;
  }
  for (int i = threadIdx.x; i < kBytes; i += blockDim.x) dump[i] = smem[i];
  // Store it back, one 64-column panel per copy (as the epilogue does).
  ptx::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int p = 0; p < kPanels; ++p)
      ptx::tma_store_5d(&out, ptx::smem_addr(smem + p * kRows * 128), p * 64, row0, 0, head, batch);
    ptx::tma_store_commit();
    ptx::tma_store_wait_read();
    *status = 1;
  }
}

// Element (row, col) of a [panel][rows][128 B] 128B-swizzled tile.
uint16_t unswizzle(const std::vector<uint8_t>& tile, int rows, int row, int col) {
  const int panel = col / 64, in_row = (col % 64) * 2;
  const int off = panel * rows * 128 + row * 128 + ((((in_row >> 4) ^ (row & 7)) << 4) | (in_row & 15));
  return static_cast<uint16_t>(tile[off] | (tile[off + 1] << 8));
}

TEST(tma_tile_load_with_rows_past_the_end_and_clipped_store) {
  REQUIRE_HOPPER();
  constexpr int kRows = 64, kPanels = 2, D = 128;
  const int64_t B = 2, S = 100, H = 3;
  DeviceTensor in(DType::bf16, B, S, H, D, true), out(DType::bf16, B, S, H, D, true);
  const auto vals = small_ints(B * S * H * D, 11);
  upload(in, vals);
  out.poison();
  const CUtensorMap m_in = make_panel_tensor_map(in.view, "in", kRows, kPanels, 128);
  const CUtensorMap m_out = make_panel_tensor_map(out.view, "out", kRows, 1, 128);
  uint8_t* dump;
  int* status;
  CUDA_OK(cudaMalloc(&dump, kRows * kPanels * 128));
  CUDA_OK(cudaMalloc(&status, 4));
  CUDA_OK(cudaMemset(status, 0, 4));
  const int row0 = 64, head = 2, batch = 1;  // rows 64..127 of a 100-row sequence
  tma_roundtrip_kernel<kRows, kPanels><<<1, 128, kRows * kPanels * 128>>>(m_in, m_out, row0, head, batch, dump, status);
  CUDA_OK(cudaDeviceSynchronize());
  int st = 0;
  CUDA_OK(cudaMemcpy(&st, status, 4, cudaMemcpyDeviceToHost));
  REQUIRE(st == 1) << "the TMA load's barrier did not complete (status " << st << ")";
  std::vector<uint8_t> tile(kRows * kPanels * 128);
  CUDA_OK(cudaMemcpy(tile.data(), dump, tile.size(), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < D; ++c) {
      const int64_t s = row0 + r;
      const uint16_t want = s < S ? vals[((batch * S + s) * H + head) * D + c] : 0;
      wrong += unswizzle(tile, kRows, r, c) != want;
    }
  CHECK(wrong == 0) << wrong << " loaded elements differ (rows past seqlen must be zero)";
  // The store writes rows 64..99 of (batch 1, head 2) and nothing else.
  const auto raw = out.raw();
  int64_t stored_wrong = 0, stray = 0;
  const auto& v = out.view;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const uint16_t got = raw[b * v.stride[0] + s * v.stride[1] + h * v.stride[2] + d];
          const bool target = b == batch && h == head && s >= row0;
          if (target) stored_wrong += got != vals[((b * S + s) * H + h) * D + d];
          else stray += got != 0xFFFF;
        }
  CHECK(stored_wrong == 0) << stored_wrong << " stored elements differ";
  CHECK(stray == 0) << stray << " elements written outside the stored rows";
  CHECK(out.written_outside_view(raw) == 0) << "the store wrote past the tensor's rows";
  cudaFree(dump);
  cudaFree(status);
}

// ---------------------------------------------------------------- mbarrier ring
// One producer thread, two consumer warpgroups, S stages, many laps: each consumer warpgroup
// sums every tile it receives; the producer waits for both releases before reusing a slot.
template <int kStages>
__global__ void ring_kernel(const __grid_constant__ CUtensorMap map, int tiles, int distinct, int* sums, int* status) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t full[kStages], empty[kStages];
  constexpr int kTileBytes = 64 * 128;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(ptx::smem_addr(&full[s]), 1);
      ptx::mbarrier_init(ptx::smem_addr(&empty[s]), 2);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (wg == 0) {
    if (threadIdx.x != 0) return;
    for (int it = 0; it < tiles; ++it) {
      const RingSlot slot = ring_slot<kStages>(it);
      if (!wait_bounded(ptx::smem_addr(&empty[slot.stage]), slot.phase ^ 1)) {
        atomicExch(status, 2);
        return;
      }
      ptx::mbarrier_arrive_expect_tx(ptx::smem_addr(&full[slot.stage]), kTileBytes);
      ptx::tma_load_5d(ptx::smem_addr(smem + slot.stage * kTileBytes), &map, ptx::smem_addr(&full[slot.stage]), 0,
                       (it % distinct) * 64, 0, 0, 0);
    }
    return;
  }
  const int consumer = wg - 1, t = threadIdx.x % 128;
  for (int it = 0; it < tiles; ++it) {
    const RingSlot slot = ring_slot<kStages>(it);
    if (!wait_bounded(ptx::smem_addr(&full[slot.stage]), slot.phase)) {
      atomicExch(status, 3);
      return;
    }
    const __nv_bfloat16* tile = reinterpret_cast<const __nv_bfloat16*>(smem + slot.stage * kTileBytes);
    int sum = 0;
    for (int i = t; i < 64 * 64; i += 128) sum += static_cast<int>(__bfloat162float(tile[i]));
    atomicAdd(&sums[it * 2 + consumer], sum);
    ptx::named_barrier_sync(3 + consumer, 128);  // every thread of this warpgroup has read the slot
    if (t == 0) ptx::mbarrier_arrive(ptx::smem_addr(&empty[slot.stage]));
  }
  if (t == 0 && consumer == 0) atomicCAS(status, 0, 1);
}

template <int kStages>
void check_ring() {
  const int distinct = 37, tiles = 1200;
  DeviceTensor t(DType::bf16, 1, distinct * 64, 1, 64, false);
  const auto vals = small_ints(distinct * 64 * 64, 5);
  upload(t, vals);
  const CUtensorMap map = make_panel_tensor_map(t.view, "t", 64, 1, 128);
  int *sums, *status;
  CUDA_OK(cudaMalloc(&sums, tiles * 2 * 4));
  CUDA_OK(cudaMalloc(&status, 4));
  CUDA_OK(cudaMemset(sums, 0, tiles * 2 * 4));
  CUDA_OK(cudaMemset(status, 0, 4));
  ring_kernel<kStages><<<1, 384, kStages * 64 * 128>>>(map, tiles, distinct, sums, status);
  CUDA_OK(cudaDeviceSynchronize());
  int st;
  std::vector<int> got(tiles * 2);
  CUDA_OK(cudaMemcpy(&st, status, 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got.data(), sums, got.size() * 4, cudaMemcpyDeviceToHost));
  REQUIRE(st == 1) << kStages << " stages: a wait timed out (status " << st << ": 2 producer, 3 consumer)";
  int wrong = 0;
  for (int it = 0; it < tiles; ++it) {
    int want = 0;
    for (int i = 0; i < 64 * 64; ++i) want += static_cast<int>(bf(vals[(it % distinct) * 64 * 64 + i]));
    wrong += got[2 * it] != want;
    wrong += got[2 * it + 1] != want;
  }
  CHECK(wrong == 0) << kStages << " stages: " << wrong << " of " << 2 * tiles << " tile checksums differ";
  cudaFree(sums);
  cudaFree(status);
}

TEST(mbarrier_ring_two_stages) {
  REQUIRE_HOPPER();
  check_ring<2>();
}
TEST(mbarrier_ring_three_stages) {
  REQUIRE_HOPPER();
  check_ring<3>();
}

// ---------------------------------------------------------------- WGMMA
template <class Cfg, int kCols>
__device__ void store_fragment(const float (&acc)[kCols / 2], float* out, int warpgroup) {
  const FragmentCoords f(threadIdx.x % 128);
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        out[(warpgroup * 64 + f.row(r)) * kCols + f.col(j, c)] = acc[4 * j + 2 * r + c];
}

// S = Q·Kᵀ for a 128-row Q tile (two warpgroups) and one K tile, through issue_qk_gemm.
template <class Cfg>
__global__ void qk_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                          float* out, int* status) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar;
  uint8_t* q = smem;
  uint8_t* k = smem + Cfg::kQTileBytes;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(ptx::smem_addr(&bar), 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::mbarrier_arrive_expect_tx(ptx::smem_addr(&bar), Cfg::kQTileBytes + Cfg::kKTileBytes);
    detail::load_panel_tile<Cfg::kPanels, Cfg::kBlockM, Cfg::kSwizzleBytes>(ptx::smem_addr(q), &tq, ptx::smem_addr(&bar), 0, 0, 0);
    detail::load_panel_tile<Cfg::kPanels, Cfg::kBlockN, Cfg::kSwizzleBytes>(ptx::smem_addr(k), &tk, ptx::smem_addr(&bar), 0, 0, 0);
  }
  if (!__syncthreads_and(wait_bounded(ptx::smem_addr(&bar), 0))) {
    if (threadIdx.x == 0) *status = 2;
    return;
  }
  const int wg = threadIdx.x / 128;
  float s[Cfg::kBlockN / 2];
  issue_qk_gemm<Cfg>(s, ptx::smem_addr(q) + wg * 64 * 128, ptx::smem_addr(k));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::pin(s);
  store_fragment<Cfg, Cfg::kBlockN>(s, out, wg);
  if (threadIdx.x == 0) *status = 1;
}

// O = P·V: P (given as a 128 x kBlockN matrix) enters as an f32 accumulator fragment, is
// converted to the A operand exactly as the main loop does, and multiplies a TMA-loaded V tile.
template <class Cfg>
__global__ void pv_kernel(const __grid_constant__ CUtensorMap tv, const float* pm, float* out, int* status) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(ptx::smem_addr(&bar), 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::mbarrier_arrive_expect_tx(ptx::smem_addr(&bar), Cfg::kVTileBytes);
    detail::load_panel_tile<Cfg::kPanels, Cfg::kBlockN, Cfg::kSwizzleBytes>(ptx::smem_addr(smem), &tv, ptx::smem_addr(&bar), 0, 0, 0);
  }
  const int wg = threadIdx.x / 128;
  const FragmentCoords f(threadIdx.x % 128);
  float s[Cfg::kBlockN / 2];
#pragma unroll
  for (int j = 0; j < Cfg::kBlockN / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) s[4 * j + 2 * r + c] = pm[(wg * 64 + f.row(r)) * Cfg::kBlockN + f.col(j, c)];
  uint32_t p[Cfg::kBlockN / 16][4];
  convert_to_operand<Cfg>(s, p);
  if (!__syncthreads_and(wait_bounded(ptx::smem_addr(&bar), 0))) {
    if (threadIdx.x == 0) *status = 2;
    return;
  }
  float o[Cfg::kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) o[i] = 0.f;
  ptx::pin(o);
  ptx::pin(p);
  issue_pv_gemm<Cfg>(o, p, ptx::smem_addr(smem));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::pin(o);
  store_fragment<Cfg, Cfg::kHeadDim>(o, out, wg);
  if (threadIdx.x == 0) *status = 1;
}

struct GemmRun {
  std::vector<float> got;
  int status = 0;
};
GemmRun read_back(float* d_out, int* d_status, size_t n) {
  GemmRun r;
  r.got.resize(n);
  cudaMemcpy(r.got.data(), d_out, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(&r.status, d_status, 4, cudaMemcpyDeviceToHost);
  return r;
}
int count_wrong(const std::vector<float>& got, const std::vector<double>& want) {
  int n = 0;
  for (size_t i = 0; i < want.size(); ++i) n += !(got[i] == want[i]);
  return n;
}

template <class Cfg>
void check_qk() {
  constexpr int D = Cfg::kHeadDim, N = Cfg::kBlockN, M = Cfg::kBlockM;
  DeviceTensor q(DType::bf16, 1, M, 1, D, false), k(DType::bf16, 1, N, 1, D, false);
  const auto qv = small_ints(M * D, 21), kv = small_ints(N * D, 22);
  upload(q, qv);
  upload(k, kv);
  const CUtensorMap tq = make_panel_tensor_map(q.view, "q", M, Cfg::kPanels, Cfg::kSwizzleBytes);
  const CUtensorMap tk = make_panel_tensor_map(k.view, "k", N, Cfg::kPanels, Cfg::kSwizzleBytes);
  float* out;
  int* status;
  CUDA_OK(cudaMalloc(&out, M * N * 4));
  CUDA_OK(cudaMalloc(&status, 4));
  CUDA_OK(cudaMemset(out, 0xFF, M * N * 4));
  CUDA_OK(cudaMemset(status, 0, 4));
  const int smem = Cfg::kQTileBytes + Cfg::kKTileBytes;
  CUDA_OK(cudaFuncSetAttribute(qk_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  qk_kernel<Cfg><<<1, 256, smem>>>(tq, tk, out, status);
  CUDA_OK(cudaDeviceSynchronize());
  const GemmRun r = read_back(out, status, M * N);
  REQUIRE(r.status == 1) << "TMA barrier timed out";
  std::vector<double> want(M * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int d = 0; d < D; ++d) acc += double(bf(qv[m * D + d])) * bf(kv[n * D + d]);
      want[m * N + n] = acc;
    }
  CHECK(count_wrong(r.got, want) == 0) << "d=" << D << " N=" << N << ": " << count_wrong(r.got, want)
                                       << " of " << M * N << " scores differ";
  cudaFree(out);
  cudaFree(status);
}

template <class Cfg>
void check_pv() {
  constexpr int D = Cfg::kHeadDim, N = Cfg::kBlockN, M = Cfg::kBlockM;
  DeviceTensor v(DType::bf16, 1, N, 1, D, false);
  const auto vv = small_ints(N * D, 31);
  upload(v, vv);
  std::vector<float> pm(M * N);
  std::mt19937_64 rng(32);
  for (auto& x : pm) x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
  const CUtensorMap tv = make_panel_tensor_map(v.view, "v", N, Cfg::kPanels, Cfg::kSwizzleBytes);
  float *d_p, *out;
  int* status;
  CUDA_OK(cudaMalloc(&d_p, M * N * 4));
  CUDA_OK(cudaMalloc(&out, M * D * 4));
  CUDA_OK(cudaMalloc(&status, 4));
  CUDA_OK(cudaMemcpy(d_p, pm.data(), M * N * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(out, 0xFF, M * D * 4));
  CUDA_OK(cudaMemset(status, 0, 4));
  CUDA_OK(cudaFuncSetAttribute(pv_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kVTileBytes));
  pv_kernel<Cfg><<<1, 256, Cfg::kVTileBytes>>>(tv, d_p, out, status);
  CUDA_OK(cudaDeviceSynchronize());
  const GemmRun r = read_back(out, status, M * D);
  REQUIRE(r.status == 1) << "TMA barrier timed out";
  std::vector<double> want(M * D);
  for (int m = 0; m < M; ++m)
    for (int d = 0; d < D; ++d) {
      double acc = 0;
      for (int n = 0; n < N; ++n) acc += double(pm[m * N + n]) * bf(vv[n * D + d]);
      want[m * D + d] = acc;
    }
  CHECK(count_wrong(r.got, want) == 0) << "d=" << D << " N=" << N << ": " << count_wrong(r.got, want)
                                       << " of " << M * D << " outputs differ";
  cudaFree(d_p);
  cudaFree(out);
  cudaFree(status);
}

using Cfg64 = ForwardConfig<__nv_bfloat16, 64, 128, 2, false>;
using Cfg128 = ForwardConfig<__nv_bfloat16, 128, 128, 2, false>;
using Cfg256 = ForwardConfig<__nv_bfloat16, 256, 80, 2, false>;

TEST(wgmma_ss_qk_d64_single_panel) {
  REQUIRE_HOPPER();
  check_qk<Cfg64>();
}
TEST(wgmma_ss_qk_d128_advance_along_k_and_panels) {
  REQUIRE_HOPPER();
  check_qk<Cfg128>();
}
TEST(wgmma_ss_qk_d256_n80) {
  REQUIRE_HOPPER();
  check_qk<Cfg256>();
}
TEST(wgmma_rs_pv_d64) {
  REQUIRE_HOPPER();
  check_pv<Cfg64>();
}
TEST(wgmma_rs_pv_d128_two_panels) {
  REQUIRE_HOPPER();
  check_pv<Cfg128>();
}
TEST(wgmma_rs_pv_d256_four_panels_n80) {
  REQUIRE_HOPPER();
  check_pv<Cfg256>();
}

// ---------------------------------------------------------------- setmaxnreg
// 384 threads at 168 registers each; the producer warpgroup drops to 24 and the consumers
// rise to 240 and keep 192 floats live. The result must be bit-exact with the host's.
constexpr int kLive = 192;
template <int kProducer, int kConsumer>
__global__ void __launch_bounds__(384, 1) register_split_kernel(const float* in, float* out, int rounds) {
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    ptx::release_registers<kProducer>();
    return;
  }
  ptx::acquire_registers<kConsumer>();
  const int t = threadIdx.x - 128;
  float acc[kLive];
#pragma unroll
  for (int i = 0; i < kLive; ++i) acc[i] = in[t * kLive + i];
  for (int r = 0; r < rounds; ++r)
#pragma unroll
    for (int i = 0; i < kLive; ++i) acc[i] = fmaf(acc[i], 0.5f, acc[(i + 1) % kLive]);
#pragma unroll
  for (int i = 0; i < kLive; ++i) out[t * kLive + i] = acc[i];
}

template <int kProducer, int kConsumer>
void check_register_split() {
  const int n = 256 * kLive, rounds = 3;
  std::vector<float> in(n);
  std::mt19937_64 rng(3);
  for (auto& x : in) x = static_cast<float>(static_cast<int>(rng() % 17) - 8);
  float *d_in, *d_out;
  CUDA_OK(cudaMalloc(&d_in, n * 4));
  CUDA_OK(cudaMalloc(&d_out, n * 4));
  CUDA_OK(cudaMemcpy(d_in, in.data(), n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_out, 0xFF, n * 4));
  register_split_kernel<kProducer, kConsumer><<<264, 384>>>(d_in, d_out, rounds);  // two waves
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got(n);
  CUDA_OK(cudaMemcpy(got.data(), d_out, n * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int t = 0; t < 256; ++t) {
    std::vector<float> acc(in.begin() + t * kLive, in.begin() + (t + 1) * kLive);
    for (int r = 0; r < rounds; ++r)
      for (int i = 0; i < kLive; ++i) acc[i] = std::fma(acc[i], 0.5f, acc[(i + 1) % kLive]);
    for (int i = 0; i < kLive; ++i) wrong += got[t * kLive + i] != acc[i];
  }
  CHECK(wrong == 0) << kProducer << "/" << kConsumer << ": " << wrong << " of " << n << " results differ";
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST(setmaxnreg_producer_24_consumers_240) {
  REQUIRE_HOPPER();
  check_register_split<24, 240>();
}
// The forward kernel's split (forward_config.hpp).
TEST(setmaxnreg_producer_40_consumers_232) {
  REQUIRE_HOPPER();
  check_register_split<40, 232>();
}

}  // namespace

HARNESS_MAIN()
