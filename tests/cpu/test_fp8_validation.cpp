// Argument validation of warpattn::quantize_fp8 and warpattn::forward_fp8: one test per rule.
// As in test_validation.cpp the tensors carry fake device addresses (never dereferenced: every
// rejected call throws before touching memory), 256 MiB apart; valid calls are checked with
// validate_quantize_fp8 / validate_forward_fp8, so the suite passes with or without a GPU.
#include <cstdint>
#include <optional>
#include <string>

#include "harness.hpp"
#include "warpattn/fp8.hpp"

namespace {

using warpattn::DType;
using warpattn::TensorView;

void* at(uintptr_t a) { return reinterpret_cast<void*>(a); }

struct Fp8Call {
  TensorView q, k, v;  // the 16-bit inputs of quantize_fp8
  warpattn::Fp8Operands f;
  TensorView out;
  std::optional<TensorView> lse;
};

TensorView view(uintptr_t address, DType t, std::initializer_list<int64_t> shape) {
  const std::vector<int64_t> s(shape);
  return warpattn::make_contiguous_view(at(address), t, static_cast<int>(s.size()), s.data());
}

// B = 2, Sq = 300, Sk = 200, Hq = 8, Hkv = 2, D = 128.
Fp8Call make_call(int64_t d = 128) {
  Fp8Call c;
  c.q = view(0x10000000, DType::bf16, {2, 300, 8, d});
  c.k = view(0x20000000, DType::bf16, {2, 200, 2, d});
  c.v = view(0x30000000, DType::bf16, {2, 200, 2, d});
  c.f.q = view(0x40000000, DType::e4m3, {2, 300, 8, d});
  c.f.k = view(0x50000000, DType::e4m3, {2, 200, 2, d});
  c.f.vt = view(0x60000000, DType::e4m3, {2, 2, d, 208});
  c.f.q_descale = view(0x70000000, DType::f32, {2, 8, 3});
  c.f.k_descale = view(0x80000000, DType::f32, {2, 2, 2});
  c.f.v_descale = view(0x90000000, DType::f32, {2, 2, 2});
  c.out = view(0xA0000000, DType::bf16, {2, 300, 8, d});
  c.lse = view(0xB0000000, DType::f32, {2, 8, 300});
  return c;
}

std::string quantize_error(const Fp8Call& c) {
  try {
    warpattn::quantize_fp8(c.q, c.k, c.v, c.f, {});
  } catch (const warpattn::Error& e) {
    return e.what();
  }
  return "";
}

std::string forward_error(const Fp8Call& c) {
  try {
    warpattn::forward_fp8(c.f, c.out, c.lse, {});
  } catch (const warpattn::Error& e) {
    return e.what();
  }
  return "";
}

// Both entry points reject the call with a message starting with `prefix` and holding `part`.
void expect_both(const Fp8Call& c, const std::string& prefix, const std::string& part) {
  for (const std::string& m : {quantize_error(c), forward_error(c)}) {
    CHECK(m.rfind(prefix, 0) == 0 && m.find(part) != std::string::npos)
        << "expected \"" << prefix << "...\" with \"" << part << "\", got \"" << m << "\"";
  }
}

// The message starts with `prefix` (one entry point's own rules).
void expect_starts(const std::string& m, const std::string& prefix) {
  CHECK(m.rfind(prefix, 0) == 0) << "expected \"" << prefix << "...\", got \"" << m << "\"";
}

std::string validate_error(const Fp8Call& c, bool quantize) {
  try {
    if (quantize)
      warpattn::validate_quantize_fp8(c.q, c.k, c.v, c.f, {});
    else
      warpattn::validate_forward_fp8(c.f, c.out, c.lse, {});
  } catch (const warpattn::Error& e) {
    return e.what();
  }
  return "";
}

// A valid call passes every argument rule of both entry points (on any machine).
void expect_valid(const Fp8Call& c, const std::string& what) {
  for (bool quantize : {true, false}) {
    const std::string m = validate_error(c, quantize);
    CHECK(m.empty()) << what << (quantize ? " (quantize_fp8): " : " (forward_fp8): ") << m;
  }
}

TEST(fp8_valid_calls_pass_validation) {
  for (int64_t d : {64, 128, 256}) expect_valid(make_call(d), "d=" + std::to_string(d));
}

// The entry points themselves stop at the device checks with these fake addresses: no device
// without a GPU, "expected device memory" with one. Nothing launches either way.
TEST(fp8_fake_addresses_stop_at_the_device_check) {
  const Fp8Call c = make_call();
  for (const std::string& m : {quantize_error(c), forward_error(c)}) {
    const bool no_device = m.rfind("no CUDA device with compute capability 9.0 (Hopper) found: ", 0) == 0;
    const bool not_device_memory = m.find(": expected device memory, got an address CUDA does not know") != std::string::npos;
    CHECK(no_device || not_device_memory) << m;
  }
}

TEST(fp8_rank) {
  Fp8Call c = make_call();
  c.f.vt.rank = 3;
  expect_both(c, "vt: ", "expected rank 4 (batch, heads, head_dim, keys), got rank 3");
}

TEST(fp8_null_pointer) {
  Fp8Call c = make_call();
  c.f.k_descale.data = nullptr;
  expect_both(c, "k_descale: ", "data is null");
}

TEST(fp8_operand_dtype) {
  Fp8Call c = make_call();
  c.f.k.dtype = DType::bf16;
  expect_both(c, "k: ", "expected dtype float8_e4m3fn, got bfloat16");
  c = make_call();
  c.f.q.dtype = DType::f16;
  expect_both(c, "q: ", "expected dtype float8_e4m3fn or int8, got float16");
}

// INT8 Q and K: both or neither, and Vᵀ stays e4m3.
TEST(fp8_int8_qk_dtype) {
  Fp8Call c = make_call();
  c.f.q.dtype = c.f.k.dtype = DType::s8;
  expect_valid(c, "int8 q, k");
  c.f.k.dtype = DType::e4m3;
  expect_both(c, "k: ", "expected dtype int8, got float8_e4m3fn");
  c = make_call();
  c.f.k.dtype = DType::s8;
  expect_both(c, "k: ", "expected dtype float8_e4m3fn, got int8");
  c = make_call();
  c.f.q.dtype = c.f.k.dtype = c.f.vt.dtype = DType::s8;
  expect_both(c, "vt: ", "expected dtype float8_e4m3fn, got int8");
}

TEST(fp8_descale_dtype) {
  Fp8Call c = make_call();
  c.f.v_descale.dtype = DType::f16;
  expect_both(c, "v_descale: ", "expected dtype float32, got float16");
}

TEST(fp8_head_dim) {
  const Fp8Call c = make_call(96);
  expect_both(c, "q: ", "must be one of 64, 128, 256 for FP8, got 96");
  // The 16-bit kernels' padded sizes are not FP8's: its kernels keep their three.
  expect_both(make_call(80), "q: ", "must be one of 64, 128, 256 for FP8, got 80");
  expect_both(make_call(200), "q: ", "must be one of 64, 128, 256 for FP8, got 200");
}

TEST(fp8_vt_shape) {
  Fp8Call c = make_call();
  c.f.vt.shape[3] = 200;  // not padded to a multiple of 16
  expect_both(c, "vt: ", "expected shape (2, 2, 128, 208) (batch, heads_kv, head_dim, seqlen_k rounded up to 16)");
}

TEST(fp8_descale_shape) {
  Fp8Call c = make_call();
  c.f.q_descale.shape[2] = 2;  // ceil(300 / 128) = 3 blocks
  expect_both(c, "q_descale: ", "expected shape (2, 8, 3)");
}

TEST(fp8_gqa) {
  Fp8Call c = make_call();
  c.f.k = view(0x50000000, DType::e4m3, {2, 200, 3, 128});
  c.f.vt = view(0x60000000, DType::e4m3, {2, 3, 128, 208});
  c.f.k_descale = view(0x80000000, DType::f32, {2, 3, 2});
  c.f.v_descale = view(0x90000000, DType::f32, {2, 3, 2});
  expect_both(c, "k: ", "query heads (8) must be a multiple of key/value heads (3)");
}

TEST(fp8_tma_stride) {
  Fp8Call c = make_call();
  c.f.vt.stride[2] = 200;  // row of Vᵀ not a multiple of 16 bytes
  expect_both(c, "vt: ", "must be a multiple of 16 bytes (TMA)");
}

TEST(fp8_quantize_input_shape) {
  Fp8Call c = make_call();
  c.v = view(0x30000000, DType::bf16, {2, 201, 2, 128});
  expect_starts(quantize_error(c), "v: expected shape (2, 200, 2, 128) (same as fp8.k)");
}

TEST(fp8_quantize_input_dtype) {
  Fp8Call c = make_call();
  c.k.dtype = DType::f16;
  expect_starts(quantize_error(c), "k: expected dtype bfloat16, got float16");
}

TEST(fp8_quantize_output_overlaps_input) {
  Fp8Call c = make_call();
  c.f.q.data = at(0x10000000 + 64);  // inside q
  expect_starts(quantize_error(c), "fp8.q: must not overlap q");
}

TEST(fp8_forward_out_dtype) {
  Fp8Call c = make_call();
  c.out.dtype = DType::e4m3;
  expect_starts(forward_error(c), "out: expected dtype float16 or bfloat16, got float8_e4m3fn");
}

TEST(fp8_forward_out_shape) {
  Fp8Call c = make_call();
  c.out = view(0xA0000000, DType::bf16, {2, 300, 4, 128});
  expect_starts(forward_error(c), "out: expected shape (2, 300, 8, 128) (same as q)");
}

TEST(fp8_forward_lse_shape) {
  Fp8Call c = make_call();
  c.lse = view(0xB0000000, DType::f32, {2, 300, 8});
  expect_starts(forward_error(c), "lse: expected shape (batch, heads_q, seqlen_q) = (2, 8, 300)");
}

TEST(fp8_forward_out_overlaps_operand) {
  Fp8Call c = make_call();
  c.out.data = at(0x60000000);
  expect_starts(forward_error(c), "out: must not overlap vt");
}

TEST(fp8_descale_broadcast_over_blocks) {
  Fp8Call c = make_call();
  c.f.k_descale.stride[2] = 0;  // one descale per (batch, head): forward_fp8 takes it
  const std::string f = validate_error(c, false);
  CHECK(f.empty()) << f;
  // quantize_fp8 writes the descales: a broadcast would have every block write one float
  expect_starts(quantize_error(c), "fp8.k_descale: stride[2] (blocks) must be positive, got 0");
  c.f.k_descale.stride[2] = -1;
  expect_starts(forward_error(c), "k_descale: stride[2] (blocks) must be zero or positive, got -1");
}

TEST(fp8_forward_out_and_lse_must_not_overlap_the_descales) {
  Fp8Call c = make_call();
  c.out.data = at(0x90000000 - 64);  // runs into v_descale
  expect_starts(forward_error(c), "out: must not overlap v_descale");
  c = make_call();
  c.lse->data = at(0x70000000 + 8);  // inside q_descale
  expect_starts(forward_error(c), "lse: must not overlap q_descale");
}

TEST(fp8_forward_lse_seqlen_stride) {
  Fp8Call c = make_call();
  c.lse->stride[2] = -1;
  expect_starts(forward_error(c), "lse: stride[2] (seqlen_q) must not be negative, got -1");
  c.lse->stride[2] = 0;
  expect_starts(forward_error(c), "lse: stride[2] (seqlen_q) must be positive for a dimension of size 300, got 0");
}

TEST(fp8_forward_out_must_not_share_memory) {
  Fp8Call c = make_call();
  c.out.stride[2] = 64;  // head_dim 128: heads overlap
  expect_starts(forward_error(c), "out: stride[2] (heads) = 64 makes distinct elements share memory");
}

TEST(fp8_quantize_codes_must_not_share_memory) {
  Fp8Call c = make_call();
  c.f.q.stride[2] = 64;  // 64 bytes: a valid TMA stride, but heads overlap at head_dim 128
  expect_starts(quantize_error(c), "fp8.q: stride[2] (heads) = 64 makes distinct elements share memory");
  c = make_call();
  c.f.vt.stride[2] = 112;  // rows of 208 keys, 112 apart
  expect_starts(quantize_error(c), "fp8.vt: stride[2] (head_dim) = 112 makes distinct elements share memory");
  c = make_call();
  c.f.q_descale.stride[1] = 2;  // 3 blocks per head, 2 apart
  expect_starts(quantize_error(c), "fp8.q_descale: stride[1] (heads) = 2 makes distinct elements share memory");
}

TEST(fp8_quantize_scaling_option) {
  const Fp8Call c = make_call();
  warpattn::QuantizeOptions o;
  o.scaling = static_cast<warpattn::Fp8Scaling>(7);
  std::string m;
  try {
    warpattn::quantize_fp8(c.q, c.k, c.v, c.f, o);
  } catch (const warpattn::Error& e) {
    m = e.what();
  }
  expect_starts(m, "options.scaling: expected per_block (0) or per_tensor (1), got 7");
}

}  // namespace
