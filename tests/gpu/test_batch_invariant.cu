// Issue 18 on the dense entries: in the batch-invariant mode a sequence's bits (out and lse; dq,
// dk and dv) are the same alone (batch 1) and as any element of batches of 2..64 others of the
// same lengths, FP16 and BF16, d 64/128/256, causal and not, the 16-bit forward (also at d = 512
// and MLA's 192/128, their own kernels), FP8 (E4M3 and INT8 Q/K) and the backward. Without a mask the default forward splits the last wave's key
// ranges over the SMs by the batch's tile count, so its bits move with the batch (counted and
// printed: the cases can tell the modes apart); the batch-invariant mode must never differ.
// Packed batches: gpu_varlen's batch_invariant_packed; KV caches: gpu_kvcache's.
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "gpu_test_support.cuh"

using gpu_test::DeviceBuffer;
using gpu_test::DeviceTensor;
using gpu_test::Fp8Buffers;
using warpattn::DType;

namespace {

constexpr int64_t kHeadsQ = 8, kHeadsKv = 2;  // GQA: each KV head serves 4 query heads

// A (B, S, H, d) problem (v's head dim dv, d when 0) whose element `pos` holds the data of the
// same problem at B = 1 (from own_seed); the other elements are random from `seed`.
struct Batch {
  int64_t B, S, d;
  DeviceTensor q, k, v;
  Batch(DType dt, int64_t B_, int64_t pos, int64_t S_, int64_t d_, uint64_t seed, uint64_t own_seed, int64_t dv = 0)
      : B(B_), S(S_), d(d_), q(dt, B_, S_, kHeadsQ, d_, false), k(dt, B_, S_, kHeadsKv, d_, false),
        v(dt, B_, S_, kHeadsKv, dv ? dv : d_, false) {
    q.fill_normal(seed), k.fill_normal(seed + 1), v.fill_normal(seed + 2);
    place(q, pos, own_seed), place(k, pos, own_seed + 1), place(v, pos, own_seed + 2);
  }
  // Element pos of t becomes what fill_normal(own) gives a batch of one.
  static void place(DeviceTensor& t, int64_t pos, uint64_t own) {
    const auto& s = t.view.shape;
    DeviceTensor one(t.view.dtype, 1, s[1], s[2], s[3], false);
    one.fill_normal(own);
    const int64_t elems = s[1] * s[2] * s[3];
    cudaMemcpy(t.mem + pos * elems, one.mem, elems * 2, cudaMemcpyDeviceToDevice);
  }
};

// The raw bits of batch element `pos`: out-like tensors (B, S, H, d) and lse (B, H, S).
std::vector<uint16_t> element(const DeviceTensor& t, int64_t pos) {
  const auto& s = t.view.shape;
  const int64_t elems = s[1] * s[2] * s[3];
  std::vector<uint16_t> h(elems);
  cudaMemcpy(h.data(), t.mem + pos * elems, elems * 2, cudaMemcpyDeviceToHost);
  return h;
}
std::vector<uint32_t> lse_element(const DeviceBuffer& lse, int64_t pos, int64_t S) {
  std::vector<uint32_t> h(kHeadsQ * S);
  cudaMemcpy(h.data(), static_cast<const char*>(lse.mem) + pos * kHeadsQ * S * 4, h.size() * 4, cudaMemcpyDeviceToHost);
  return h;
}

// What a call leaves for the chosen element, as bits (lse's too: == on floats would take -0 for 0).
struct Bits {
  std::vector<std::vector<uint16_t>> tensors;
  std::vector<uint32_t> lse;
  bool operator==(const Bits& o) const { return tensors == o.tensors && lse == o.lse; }
  // 0xFFFF (the poison, a NaN) or any other NaN left in a 16-bit result, or a NaN lse.
  int64_t nans(DType dt) const {
    int64_t n = 0;
    for (const auto& t : tensors)
      for (uint16_t x : t) n += dt == DType::bf16 ? ((x & 0x7F80) == 0x7F80 && (x & 0x7F)) : ((x & 0x7C00) == 0x7C00 && (x & 0x3FF));
    for (uint32_t x : lse) n += (x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu);
    return n;
  }
};

warpattn::TensorView lse_view(const DeviceBuffer& lse, int64_t B, int64_t S) {
  return gpu_test::contiguous(lse.mem, DType::f32, {B, kHeadsQ, S});
}

Bits forward_bits(DType dt, int64_t B, int64_t pos, int64_t S, int64_t d, bool causal, bool invariant, uint64_t seed,
                  uint64_t own_seed, int64_t dv = 0) {
  Batch b(dt, B, pos, S, d, seed, own_seed, dv);
  DeviceTensor out(dt, B, S, kHeadsQ, dv ? dv : d, false);
  out.poison();
  DeviceBuffer lse(B * kHeadsQ * S * 4);
  warpattn::ForwardOptions o;
  o.causal = causal, o.batch_invariant = invariant;
  warpattn::forward(b.q.view, b.k.view, b.v.view, out.view, lse_view(lse, B, S), o);
  cudaDeviceSynchronize();
  return Bits{{element(out, pos)}, lse_element(lse, pos, S)};
}

// INT8 (s8) or E4M3 Q and K, per-block descales (a block's descale follows its own 128 rows;
// per-tensor scaling would follow the whole batch), out in dt.
Bits fp8_bits(DType dt, DType qk, int64_t B, int64_t pos, int64_t S, int64_t d, bool causal, bool invariant,
              uint64_t seed, uint64_t own_seed) {
  Batch b(dt, B, pos, S, d, seed, own_seed);
  Fp8Buffers f(B, S, S, kHeadsQ, kHeadsKv, d, qk);
  warpattn::QuantizeOptions qo;
  qo.seed = own_seed;
  warpattn::quantize_fp8(b.q.view, b.k.view, b.v.view, f.ops, qo, nullptr);
  DeviceTensor out(dt, B, S, kHeadsQ, d, false);
  out.poison();
  DeviceBuffer lse(B * kHeadsQ * S * 4);
  warpattn::ForwardOptions o;
  o.causal = causal, o.batch_invariant = invariant;
  warpattn::forward_fp8(f.ops, out.view, lse_view(lse, B, S), o, nullptr, false);
  cudaDeviceSynchronize();
  return Bits{{element(out, pos)}, lse_element(lse, pos, S)};
}

// dq, dk, dv of element pos (dout random like the inputs; out and lse from the forward in the
// same mode).
Bits backward_bits(DType dt, int64_t B, int64_t pos, int64_t S, int64_t d, bool causal, uint64_t seed,
                   uint64_t own_seed) {
  Batch b(dt, B, pos, S, d, seed, own_seed);
  DeviceTensor dout(dt, B, S, kHeadsQ, d, false), out(dt, B, S, kHeadsQ, d, false);
  dout.fill_normal(seed + 3);
  Batch::place(dout, pos, own_seed + 3);
  DeviceBuffer lse(B * kHeadsQ * S * 4);
  warpattn::ForwardOptions fo;
  fo.causal = causal, fo.batch_invariant = true;
  warpattn::forward(b.q.view, b.k.view, b.v.view, out.view, lse_view(lse, B, S), fo);
  DeviceTensor dq(dt, B, S, kHeadsQ, d, false), dk(dt, B, S, kHeadsKv, d, false), dv(dt, B, S, kHeadsKv, d, false);
  dq.poison(), dk.poison(), dv.poison();
  warpattn::BackwardOptions bo;
  bo.causal = causal, bo.batch_invariant = true;
  warpattn::backward(dout.view, b.q.view, b.k.view, b.v.view, out.view, lse_view(lse, B, S), dq.view, dk.view,
                     dv.view, bo);
  cudaDeviceSynchronize();
  return Bits{{element(dq, pos), element(dk, pos), element(dv, pos)}, {}};
}

const char* name(DType dt) { return dt == DType::bf16 ? "bf16" : "f16"; }

}  // namespace

TEST(dense_forward_batch_invariant) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  const int64_t S = 1000;  // 8 query blocks a head: the batch's tile count decides the default's split
  // (q/k head dim, v's): the three 16-bit kernels, MLA's 192/128 kernel and the 512 kernel.
  const int64_t dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}, {512, 512}};
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [d, dv] : dims)
      for (bool causal : {false, true}) {
        const Bits alone = forward_bits(dt, 1, 0, S, d, causal, true, seed, seed + 7, dv);
        CHECK(alone.nans(dt) == 0) << name(dt) << " d=" << d << ": the batch of one left " << alone.nans(dt) << " NaNs";
        int checked = 0, differ = 0, default_differ = 0;
        for (int64_t B : {2, 5, 64})
          for (int64_t pos : {int64_t{0}, B / 2, B - 1}) {
            const uint64_t others = seed + 100 * B + pos;
            differ += !(forward_bits(dt, B, pos, S, d, causal, true, others, seed + 7, dv) == alone);
            default_differ += !(forward_bits(dt, B, pos, S, d, causal, false, others, seed + 7, dv) == alone);
            ++checked;
          }
        printf("    %s d=%lld/%lld %s: %d of %d batches differ from the sequence alone (default mode: %d)\n", name(dt),
               static_cast<long long>(d), static_cast<long long>(dv), causal ? "causal" : "full", differ, checked,
               default_differ);
        CHECK(differ == 0) << name(dt) << " d=" << d << "/" << dv << (causal ? " causal" : " full") << ": batch-invariant out/lse differ in "
                           << differ << " of " << checked << " batches, seed " << seed;
      }
}

TEST(fp8_forward_batch_invariant) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  const int64_t S = 1000;
  for (DType qk : {DType::e4m3, DType::s8})
    for (int d : {64, 128, 256})
      for (bool causal : {false, true}) {
        const Bits alone = fp8_bits(DType::bf16, qk, 1, 0, S, d, causal, true, seed, seed + 7);
        CHECK(alone.nans(DType::bf16) == 0) << "d=" << d << ": the batch of one left NaNs";
        int checked = 0, differ = 0, default_differ = 0;
        for (int64_t B : {3, 64})
          for (int64_t pos : {int64_t{0}, B - 1}) {
            const uint64_t others = seed + 100 * B + pos;
            differ += !(fp8_bits(DType::bf16, qk, B, pos, S, d, causal, true, others, seed + 7) == alone);
            default_differ += !(fp8_bits(DType::bf16, qk, B, pos, S, d, causal, false, others, seed + 7) == alone);
            ++checked;
          }
        printf("    %s d=%d %s: %d of %d batches differ from the sequence alone (default mode: %d)\n",
               qk == DType::s8 ? "int8 q/k" : "e4m3", d, causal ? "causal" : "full", differ, checked, default_differ);
        CHECK(differ == 0) << (qk == DType::s8 ? "int8" : "e4m3") << " d=" << d << (causal ? " causal" : " full")
                           << ": batch-invariant out/lse differ in " << differ << " of " << checked << " batches, seed "
                           << seed;
      }
}

TEST(backward_batch_invariant) {
  REQUIRE_HOPPER();
  const uint64_t seed = gpu_test::fresh_seed();
  const int64_t S = 700;
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128, 256})
      for (bool causal : {false, true}) {
        const Bits alone = backward_bits(dt, 1, 0, S, d, causal, seed, seed + 7);
        CHECK(alone.nans(dt) == 0) << name(dt) << " d=" << d << ": the batch of one left " << alone.nans(dt) << " NaNs";
        int checked = 0, differ = 0;
        for (int64_t B : {3, 16})
          for (int64_t pos : {int64_t{0}, B - 1}) {
            differ += !(backward_bits(dt, B, pos, S, d, causal, seed + 100 * B + pos, seed + 7) == alone);
            ++checked;
          }
        printf("    %s d=%d %s: %d of %d batches' dq/dk/dv differ from the sequence alone\n", name(dt), d,
               causal ? "causal" : "full", differ, checked);
        CHECK(differ == 0) << name(dt) << " d=" << d << (causal ? " causal" : " full") << ": batch-invariant gradients differ in "
                           << differ << " of " << checked << " batches, seed " << seed;
      }
}

HARNESS_MAIN()
