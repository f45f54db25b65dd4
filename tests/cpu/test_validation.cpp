// warpattn::forward's argument validation, one test per rule (and per distinct sub-case).
//
// Every rejected call must throw warpattn::Error before touching memory or the GPU, so the
// tensors here carry fake device addresses, 256 MiB apart so that they never overlap unless a
// test makes them. Valid calls are checked with warpattn::validate_forward, which runs the
// same rules and stops there; forward itself with these fake addresses must stop at the device
// checks (no GPU: the "compute capability 9.0" message; a GPU: "expected device memory"), so
// the suite passes on any machine and never lets a fake pointer reach a kernel.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "harness.hpp"
#include "warpattn/warpattn.hpp"

namespace {

using warpattn::DType;
using warpattn::TensorView;

constexpr uintptr_t kQ = 0x10000000, kK = 0x20000000, kV = 0x30000000, kOut = 0x40000000,
                    kLse = 0x50000000;

void* fake_device_pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

struct Sizes {
  int64_t batch = 2, seqlen_q = 128, seqlen_k = 256, heads_q = 8, heads_kv = 2, head_dim = 128;
};

struct Call {
  TensorView q, k, v, out;
  std::optional<TensorView> lse;
  warpattn::ForwardOptions options;
};

// A valid call (contiguous tensors, with lse) of the given sizes.
Call make_call(const Sizes& s = {}, DType dtype = DType::bf16) {
  const int64_t q_shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.head_dim};
  const int64_t kv_shape[4] = {s.batch, s.seqlen_k, s.heads_kv, s.head_dim};
  const int64_t lse_shape[3] = {s.batch, s.heads_q, s.seqlen_q};
  Call c;
  c.q = warpattn::make_contiguous_view(fake_device_pointer(kQ), dtype, 4, q_shape);
  c.k = warpattn::make_contiguous_view(fake_device_pointer(kK), dtype, 4, kv_shape);
  c.v = warpattn::make_contiguous_view(fake_device_pointer(kV), dtype, 4, kv_shape);
  c.out = warpattn::make_contiguous_view(fake_device_pointer(kOut), dtype, 4, q_shape);
  c.lse = warpattn::make_contiguous_view(fake_device_pointer(kLse), DType::f32, 3, lse_shape);
  return c;
}

// The message of the warpattn::Error that forward throws, or nullopt if it returns.
std::optional<std::string> error_of(const Call& c) {
  try {
    warpattn::forward(c.q, c.k, c.v, c.out, c.lse, c.options);
  } catch (const warpattn::Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

bool hopper_present() {
  static const bool present = [] {
    int count = 0, major = 0, minor = 0;
    const bool ok =
        cudaGetDeviceCount(&count) == cudaSuccess && count > 0 &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess;
    cudaGetLastError();  // a failed query must not leak into later checks
    return ok && major == 9 && minor == 0;
  }();
  return present;
}

// forward must reject the call with a message that starts with "<argument>: " and contains
// every one of `expected` (the expectation and what came).
void expect_rejected(const Call& c, const std::string& argument,
                     std::initializer_list<const char*> expected, int line) {
  const std::optional<std::string> message = error_of(c);
  if (!message) {
    CHECK(false) << "line " << line << ": forward accepted the call, expected an error about "
                 << argument;
    return;
  }
  CHECK(message->rfind(argument + ": ", 0) == 0)
      << "line " << line << ": message should name " << argument << " first: " << *message;
  for (const char* text : expected)
    CHECK(message->find(text) != std::string::npos)
        << "line " << line << ": missing \"" << text << "\" in: " << *message;
}
#define EXPECT_REJECTED(call, argument, ...) \
  expect_rejected(call, argument, {__VA_ARGS__}, __LINE__)

// The call must pass every argument rule (warpattn::validate_forward, the rules forward runs
// before it looks at the device; on any machine, with or without a GPU).
void expect_valid(const Call& c, int line) {
  std::string message;
  try {
    warpattn::validate_forward(c.q, c.k, c.v, c.out, c.lse, c.options);
  } catch (const warpattn::Error& e) {
    message = e.what();
  }
  CHECK(message.empty()) << "line " << line << ": expected a valid call, got: " << message;
}
#define EXPECT_VALID(call) expect_valid(call, __LINE__)

// forward must return without error and without needing any GPU (nothing to compute).
void expect_returns_at_once(const Call& c, int line) {
  const std::optional<std::string> message = error_of(c);
  CHECK(!message) << "line " << line << ": " << *message;
}
#define EXPECT_RETURNS_AT_ONCE(call) expect_returns_at_once(call, __LINE__)

}  // namespace

// ---------------------------------------------------------------- helpers of the API

TEST(dtype_names) {
  CHECK(std::strcmp(warpattn::dtype_name(DType::f16), "float16") == 0);
  CHECK(std::strcmp(warpattn::dtype_name(DType::bf16), "bfloat16") == 0);
  CHECK(std::strcmp(warpattn::dtype_name(DType::f32), "float32") == 0);
  CHECK(warpattn::dtype_name(static_cast<DType>(7)) != nullptr);
}

TEST(make_contiguous_view_has_row_major_strides) {
  const int64_t shape[4] = {2, 3, 4, 64};
  int dummy = 0;
  const TensorView t = warpattn::make_contiguous_view(&dummy, DType::f16, 4, shape);
  CHECK(t.data == &dummy && t.dtype == DType::f16 && t.rank == 4);
  const int64_t want[4] = {3 * 4 * 64, 4 * 64, 64, 1};
  for (int i = 0; i < 4; ++i) {
    CHECK(t.shape[i] == shape[i]) << i;
    CHECK(t.stride[i] == want[i]) << i << ": " << t.stride[i];
  }
  CHECK(t.numel() == 2 * 3 * 4 * 64);
  const int64_t lse_shape[3] = {2, 8, 5};
  const TensorView l = warpattn::make_contiguous_view(nullptr, DType::f32, 3, lse_shape);
  CHECK(l.rank == 3 && l.stride[0] == 40 && l.stride[1] == 5 && l.stride[2] == 1);
}

TEST(make_contiguous_view_keeps_strides_positive_for_empty_tensors) {
  const int64_t shape[4] = {2, 0, 4, 64};
  const TensorView t = warpattn::make_contiguous_view(nullptr, DType::bf16, 4, shape);
  CHECK(t.stride[0] == 256 && t.stride[1] == 256 && t.stride[2] == 64 && t.stride[3] == 1);
  CHECK(t.numel() == 0);
}

// ---------------------------------------------------------------- valid calls

TEST(valid_call_without_hopper_reports_compute_capability) {
  if (hopper_present())
    SKIP("a Hopper GPU is present; the launch is exercised by test_gpu_forward");
  // Without a usable driver the runtime's initialisation error persists whatever anyone does;
  // only where the last error can be cleared at all can forward be asked to leave none behind.
  cudaGetLastError();
  const bool last_error_clearable = cudaGetLastError() == cudaSuccess;
  const std::optional<std::string> message = error_of(make_call());
  REQUIRE(message.has_value());
  CHECK(message->find("no CUDA device with compute capability 9.0 (Hopper) found: ") == 0)
      << *message;
  if (last_error_clearable) {
    CHECK(cudaGetLastError() == cudaSuccess);
  }
}

// On any machine: with a GPU, the fake addresses are not device memory; without one, there
// is no device. Either way the call stops before any launch.
TEST(valid_call_with_addresses_cuda_does_not_know_is_refused) {
  const std::optional<std::string> message = error_of(make_call());
  REQUIRE(message.has_value());
  const bool no_device = message->find("no CUDA device with compute capability 9.0 (Hopper) found: ") == 0;
  const bool not_device_memory =
      message->rfind("q: expected device memory, got an address CUDA does not know (host memory?) at 0x10000000", 0) == 0;
  CHECK(no_device || not_device_memory) << *message;
  if (hopper_present()) CHECK(not_device_memory) << *message;
}

TEST(valid_variants_pass_validation) {
  Call f16 = make_call({}, DType::f16);
  EXPECT_VALID(f16);
  Call no_lse = make_call();
  no_lse.lse.reset();
  EXPECT_VALID(no_lse);
  Call causal_scaled = make_call();
  causal_scaled.options.causal = true;
  causal_scaled.options.softmax_scale = 0.25f;
  EXPECT_VALID(causal_scaled);
  for (int64_t d : {64, 256}) {
    Sizes s;
    s.head_dim = d;
    EXPECT_VALID(make_call(s));
  }
  Sizes mha, mqa;
  mha.heads_kv = 8;
  mqa.heads_kv = 1;
  EXPECT_VALID(make_call(mha));
  EXPECT_VALID(make_call(mqa));
  Sizes one_row;  // seqlen 1, batch 1: the smallest non-empty problem
  one_row.batch = 1;
  one_row.seqlen_q = one_row.seqlen_k = 1;
  EXPECT_VALID(make_call(one_row));
}

TEST(valid_padded_strides_pass_validation) {
  // Padded heads and sequence rows, as in a slice of a packed QKV tensor: strides need only be
  // multiples of 16 bytes (8 bf16 elements).
  Call c = make_call();
  c.k.stride[2] = 136;
  c.k.stride[1] = 2 * 136 + 8;
  c.k.stride[0] = 256 * c.k.stride[1];
  c.v = c.k;
  c.v.data = fake_device_pointer(kV);
  EXPECT_VALID(c);
}

TEST(valid_size_one_dimension_may_have_any_stride_multiple_of_16_bytes) {
  Sizes s;
  s.batch = 1;
  Call c = make_call(s);
  c.q.stride[0] = 0;  // never stepped over
  c.out.stride[0] = 8;
  EXPECT_VALID(c);
}

TEST(valid_lse_needs_only_4_byte_alignment) {
  Call c = make_call();
  c.lse->data = fake_device_pointer(kLse + 4);
  EXPECT_VALID(c);
}

TEST(valid_out_directly_after_q_does_not_overlap) {
  Call c = make_call();
  c.out.data = fake_device_pointer(kQ + 2 * 128 * 8 * 128 * 2);  // q's size in bytes
  EXPECT_VALID(c);
}

TEST(valid_no_keys_needs_no_key_or_value_memory) {
  // seqlen_k == 0: every output row is zero (lse -inf); k and v are empty, so null is fine.
  Sizes s;
  s.seqlen_k = 0;
  Call c = make_call(s);
  c.k.data = nullptr;
  c.v.data = nullptr;
  EXPECT_VALID(c);
}

TEST(empty_batch_returns_without_gpu) {
  Sizes s;
  s.batch = 0;
  Call c = make_call(s);
  c.q.data = c.k.data = c.v.data = c.out.data = c.lse->data = nullptr;
  EXPECT_RETURNS_AT_ONCE(c);
}

TEST(empty_query_sequence_returns_without_gpu) {
  Sizes s;
  s.seqlen_q = 0;
  Call c = make_call(s);
  c.q.data = c.out.data = c.lse->data = nullptr;
  EXPECT_RETURNS_AT_ONCE(c);
}

TEST(zero_query_heads_returns_without_gpu) {
  Sizes s;
  s.heads_q = 0;
  s.heads_kv = 1;
  Call c = make_call(s);
  c.q.data = c.out.data = c.lse->data = nullptr;
  EXPECT_RETURNS_AT_ONCE(c);
}

// ---------------------------------------------------------------- a. rank

TEST(rank_of_q_must_be_4) {
  Call c = make_call();
  c.q.rank = 3;
  EXPECT_REJECTED(c, "q", "expected rank 4 (batch, seqlen, heads, head_dim), got rank 3");
}

TEST(rank_of_k_must_be_4) {
  Call c = make_call();
  c.k.rank = 2;
  EXPECT_REJECTED(c, "k", "expected rank 4", "got rank 2");
}

TEST(rank_of_v_must_be_4) {
  Call c = make_call();
  c.v.rank = 0;
  EXPECT_REJECTED(c, "v", "expected rank 4", "got rank 0");
}

TEST(rank_of_out_must_be_4) {
  Call c = make_call();
  c.out.rank = 5;
  EXPECT_REJECTED(c, "out", "expected rank 4", "got rank 5");
}

TEST(rank_of_lse_must_be_3) {
  Call c = make_call();
  c.lse->rank = 4;
  EXPECT_REJECTED(c, "lse", "expected rank 3 (batch, heads, seqlen_q), got rank 4");
}

// ---------------------------------------------------------------- b. negative sizes

TEST(negative_size_of_q_is_rejected) {
  Call c = make_call();
  c.q.shape[1] = -5;
  EXPECT_REJECTED(c, "q", "shape[1] (seqlen) must not be negative, got -5");
}

TEST(negative_size_of_k_is_rejected) {
  Call c = make_call();
  c.k.shape[2] = -1;
  EXPECT_REJECTED(c, "k", "shape[2] (heads)", "must not be negative", "-1");
}

TEST(negative_size_of_lse_is_rejected) {
  Call c = make_call();
  c.lse->shape[0] = -2;
  EXPECT_REJECTED(c, "lse", "shape[0] (batch)", "must not be negative", "-2");
}

// ---------------------------------------------------------------- c. null pointers

TEST(null_q_is_rejected) {
  Call c = make_call();
  c.q.data = nullptr;
  EXPECT_REJECTED(c, "q", "data is null", "non-empty", "(2, 128, 8, 128)");
}

TEST(null_k_is_rejected) {
  Call c = make_call();
  c.k.data = nullptr;
  EXPECT_REJECTED(c, "k", "data is null", "(2, 256, 2, 128)");
}

TEST(null_v_is_rejected) {
  Call c = make_call();
  c.v.data = nullptr;
  EXPECT_REJECTED(c, "v", "data is null");
}

TEST(null_out_is_rejected) {
  Call c = make_call();
  c.out.data = nullptr;
  EXPECT_REJECTED(c, "out", "data is null");
}

TEST(null_lse_is_rejected) {
  Call c = make_call();
  c.lse->data = nullptr;
  EXPECT_REJECTED(c, "lse", "data is null", "(2, 8, 128)");
}

// ---------------------------------------------------------------- d. dtypes

TEST(q_must_be_float16_or_bfloat16) {
  Call c = make_call({}, DType::f32);
  EXPECT_REJECTED(c, "q", "expected dtype float16 or bfloat16, got float32");
}

TEST(k_dtype_must_match_q) {
  Call c = make_call();
  c.k.dtype = DType::f16;
  EXPECT_REJECTED(c, "k", "expected dtype bfloat16 (same as q), got float16");
}

TEST(v_dtype_must_match_q) {
  Call c = make_call({}, DType::f16);
  c.v.dtype = DType::bf16;
  EXPECT_REJECTED(c, "v", "expected dtype float16 (same as q), got bfloat16");
}

TEST(out_dtype_must_match_q) {
  Call c = make_call();
  c.out.dtype = DType::f32;
  EXPECT_REJECTED(c, "out", "expected dtype bfloat16 (same as q), got float32");
}

TEST(lse_must_be_float32) {
  Call c = make_call();
  c.lse->dtype = DType::bf16;
  EXPECT_REJECTED(c, "lse", "expected dtype float32, got bfloat16");
}

// ---------------------------------------------------------------- e. head dimension

// Any multiple of 8 from 8 to 512 runs in the dense forward, in the 64, 128, 256 or 512 kernel
// with the missing columns zero-filled; the message states the rule rather than listing 64 sizes.
TEST(unsupported_head_dim_states_the_rule) {
  for (int64_t d : {100, 4, 0, 12, 257, 516, 520, 1024}) {
    Sizes s;
    s.head_dim = d;
    const std::string got = ", got " + std::to_string(d);
    EXPECT_REJECTED(make_call(s), "q", "head_dim (shape[3]) must be a multiple of 8 from 8 to 512", got.c_str());
  }
}

// The padded sizes pass validation: the smallest, the largest, and ones between the kernels
// (72 runs in the 128 kernel, 200 in the 256 one, 264 and 488 in the 512 one); f16 as bf16.
TEST(padded_head_dims_pass_validation) {
  for (int64_t d : {8, 16, 40, 72, 80, 96, 112, 136, 200, 248, 256, 264, 384, 488, 512}) {
    Sizes s;
    s.head_dim = d;
    EXPECT_VALID(make_call(s));
    EXPECT_VALID(make_call(s, DType::f16));
  }
}

TEST(k_head_dim_must_match_q) {
  Call c = make_call();
  c.k.shape[3] = 64;
  EXPECT_REJECTED(c, "k", "expected head_dim 128 (same as q), got 64");
}

// v's head dim may differ from q's (MLA's 192/128) but not pass q's compiled head dim: the
// kernel is chosen by q's, and the backward's workspace sized from q alone.
TEST(v_head_dim_at_most_q_compiled_head_dim) {
  Call c = make_call();
  c.v.shape[3] = 256;
  c.out.shape[3] = 256;
  EXPECT_REJECTED(c, "v", "head_dim (shape[3]) must be at most 128 (q's head_dim 128 rounded up to 64, 128, 256 or 512), got 256");
  c.v.shape[3] = 100;
  c.out.shape[3] = 100;
  EXPECT_REJECTED(c, "v", "head_dim (shape[3]) must be a multiple of 8 from 8 to 512, got 100");
  // q's 256 against v's 264 (the 512 kernel's): refused; q's 512 takes v's 264 (or 128).
  Sizes s;
  s.head_dim = 256;
  Call w = make_call(s);
  w.v.shape[3] = w.out.shape[3] = 264;
  EXPECT_REJECTED(w, "v", "must be at most 256 (q's head_dim 256 rounded up to 64, 128, 256 or 512), got 264");
  s.head_dim = 512;
  for (const int64_t dv : {264, 128}) {
    Call x = make_call(s);
    x.v.shape[3] = x.out.shape[3] = dv;
    EXPECT_VALID(x);
  }
}

TEST(v_head_dim_may_differ_from_q) {
  for (const int64_t dv : {8, 64, 96, 120, 128}) {  // q's 128: anything up to it
    Call c = make_call();
    c.v.shape[3] = dv;
    c.out.shape[3] = dv;
    EXPECT_VALID(c);
  }
  Sizes s;
  s.head_dim = 192;  // MLA's prefill: q and k 192, v and out 128
  Call c = make_call(s);
  c.v.shape[3] = 128;
  c.out.shape[3] = 128;
  EXPECT_VALID(c);
}

TEST(out_head_dim_must_match_v) {
  Call c = make_call();
  c.out.shape[3] = 64;
  EXPECT_REJECTED(c, "out", "expected head_dim 128 (same as v), got 64");
  c.v.shape[3] = 64;
  c.out.shape[3] = 128;
  EXPECT_REJECTED(c, "out", "expected head_dim 64 (same as v), got 128");
}

// ---------------------------------------------------------------- f. batch and shapes

TEST(k_batch_must_match_q) {
  Call c = make_call();
  c.k.shape[0] = 3;
  EXPECT_REJECTED(c, "k", "expected batch 2 (same as q), got 3");
}

TEST(v_batch_must_match_q) {
  Call c = make_call();
  c.v.shape[0] = 1;
  EXPECT_REJECTED(c, "v", "expected batch 2 (same as q), got 1");
}

TEST(out_batch_must_match_q) {
  Call c = make_call();
  c.out.shape[0] = 4;
  EXPECT_REJECTED(c, "out", "expected batch 2 (same as q), got 4");
}

TEST(v_seqlen_must_match_k) {
  Call c = make_call();
  c.v.shape[1] = 255;
  EXPECT_REJECTED(c, "v", "expected shape (2, 256, 2, 128) (same as k), got (2, 255, 2, 128)");
}

TEST(v_heads_must_match_k) {
  Call c = make_call();
  c.v.shape[2] = 4;
  EXPECT_REJECTED(c, "v", "expected shape (2, 256, 2, 128) (same as k), got (2, 256, 4, 128)");
}

TEST(out_seqlen_must_match_q) {
  Call c = make_call();
  c.out.shape[1] = 64;
  EXPECT_REJECTED(c, "out", "expected shape (2, 128, 8, 128) (same as q), got (2, 64, 8, 128)");
}

TEST(out_heads_must_match_q) {
  Call c = make_call();
  c.out.shape[2] = 2;
  EXPECT_REJECTED(c, "out", "expected shape (2, 128, 8, 128) (same as q), got (2, 128, 2, 128)");
}

TEST(lse_shape_must_be_batch_heads_seqlen) {
  // A common mistake: (batch, seqlen, heads) instead of (batch, heads, seqlen).
  Call c = make_call();
  c.lse->shape[1] = 128;
  c.lse->shape[2] = 8;
  EXPECT_REJECTED(c, "lse",
                  "expected shape (batch, heads_q, seqlen_q) = (2, 8, 128), got (2, 128, 8)");
  Call short_rows = make_call();
  short_rows.lse->shape[2] = 127;
  EXPECT_REJECTED(short_rows, "lse",
                  "expected shape (batch, heads_q, seqlen_q) = (2, 8, 128), got (2, 8, 127)");
}

// ---------------------------------------------------------------- g. heads

TEST(query_heads_must_be_a_multiple_of_kv_heads) {
  Sizes s;
  s.heads_q = 32;
  s.heads_kv = 5;
  EXPECT_REJECTED(make_call(s), "k", "query heads (32) must be a multiple of key/value heads (5)");
}

TEST(kv_heads_must_be_at_least_one_when_there_are_query_heads) {
  Sizes s;
  s.heads_kv = 0;
  Call c = make_call(s);
  EXPECT_REJECTED(c, "k", "expected at least 1 key/value head for 8 query heads, got 0");
}

// ---------------------------------------------------------------- h. contiguous last dimension

TEST(q_last_dim_must_be_contiguous) {
  Call c = make_call();
  c.q.stride[3] = 2;
  EXPECT_REJECTED(
      c, "q", "last dimension (head_dim) must be contiguous (stride[3] == 1), got stride[3] = 2");
}

TEST(k_last_dim_must_be_contiguous) {
  Call c = make_call();
  c.k.stride[3] = 0;
  EXPECT_REJECTED(c, "k", "must be contiguous (stride[3] == 1)", "got stride[3] = 0");
}

TEST(v_last_dim_must_be_contiguous) {
  Call c = make_call();
  c.v.stride[3] = -1;
  EXPECT_REJECTED(c, "v", "must be contiguous (stride[3] == 1)", "got stride[3] = -1");
}

TEST(out_last_dim_must_be_contiguous) {
  Call c = make_call();
  c.out.stride[3] = 8;
  EXPECT_REJECTED(c, "out", "must be contiguous (stride[3] == 1)", "got stride[3] = 8");
}

// lse is written from registers, not through TMA, so a strided lse is valid.
TEST(lse_may_be_strided) {
  Call c = make_call();
  c.lse->stride[2] = 2;
  c.lse->stride[1] *= 2;
  c.lse->stride[0] *= 2;
  EXPECT_VALID(c);
}

// ---------------------------------------------------------------- i. alignment and strides

TEST(q_base_must_be_16_byte_aligned) {
  Call c = make_call();
  c.q.data = fake_device_pointer(kQ + 8);
  EXPECT_REJECTED(c, "q", "data pointer 0x10000008 must be 16-byte aligned (TMA)");
}

TEST(out_base_must_be_16_byte_aligned) {
  Call c = make_call();
  c.out.data = fake_device_pointer(kOut + 2);
  EXPECT_REJECTED(c, "out", "data pointer 0x40000002 must be 16-byte aligned");
}

TEST(lse_base_must_be_4_byte_aligned) {
  Call c = make_call();
  c.lse->data = fake_device_pointer(kLse + 2);
  EXPECT_REJECTED(c, "lse", "data pointer 0x50000002 must be 4-byte aligned");
}

TEST(stride_must_be_a_multiple_of_16_bytes) {
  Call c = make_call();
  c.k.stride[1] = 2 * 128 + 4;  // 520 bytes
  EXPECT_REJECTED(
      c, "k", "stride[1] (seqlen) = 260 elements = 520 bytes must be a multiple of 16 bytes (TMA)");
}

TEST(head_stride_must_be_a_multiple_of_16_bytes) {
  Call c = make_call();
  c.v.stride[2] = 129;
  EXPECT_REJECTED(c, "v", "stride[2] (heads)", "258 bytes", "multiple of 16 bytes");
}

TEST(stride_must_be_positive_for_dimensions_larger_than_one) {
  // A zero batch stride would make both batches read (or for out, write) the same memory.
  Call c = make_call();
  c.out.stride[0] = 0;
  EXPECT_REJECTED(c, "out", "stride[0] (batch) must be positive for a dimension of size 2, got 0");
}

TEST(stride_must_not_be_negative) {
  Call c = make_call();
  c.q.stride[1] = -1024;
  EXPECT_REJECTED(c, "q", "stride[1] (seqlen) must not be negative, got -1024");
}

TEST(stride_must_be_below_2_pow_40_bytes) {
  Call c = make_call();
  c.k.stride[0] = int64_t(1) << 39;  // 2^40 bytes of bf16
  EXPECT_REJECTED(c, "k", "stride[0] (batch)", "must be less than 2^40 bytes (TMA)");
}

TEST(lse_stride_must_be_positive_for_dimensions_larger_than_one) {
  Call c = make_call();
  c.lse->stride[1] = 0;
  EXPECT_REJECTED(c, "lse", "stride[1] (heads) must be positive for a dimension of size 8, got 0");
}

// lse is written with plain stores: its seqlen stride was never checked (a negative one
// wrote below lse's base, a zero one made rows overwrite each other).
TEST(lse_seqlen_stride_must_not_be_negative) {
  Call c = make_call();
  c.lse->stride[2] = -1;
  EXPECT_REJECTED(c, "lse", "stride[2] (seqlen_q) must not be negative, got -1");
}

TEST(lse_seqlen_stride_must_be_positive) {
  Call c = make_call();
  c.lse->stride[2] = 0;
  EXPECT_REJECTED(c, "lse", "stride[2] (seqlen_q) must be positive for a dimension of size 128, got 0");
}

// ---------------------------------------------------------------- j. 32-bit coordinates

TEST(seqlen_must_fit_32_bit_coordinates) {
  Sizes s;
  s.seqlen_k = int64_t(1) << 31;
  Call c = make_call(s);
  // Keep the batch stride legal (below 2^40 bytes) so that only the size is wrong.
  c.k.stride[0] = c.v.stride[0] = 8;
  EXPECT_REJECTED(c, "k", "seqlen (shape[1]) = 2147483648 must be less than 2^31");
}

TEST(batch_must_fit_32_bit_coordinates) {
  Sizes s;
  s.batch = int64_t(1) << 31;
  EXPECT_REJECTED(make_call(s), "q", "batch (shape[0]) = 2147483648 must be less than 2^31");
}

// ---------------------------------------------------------------- k. softmax scale

TEST(softmax_scale_must_not_be_nan) {
  Call c = make_call();
  c.options.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_REJECTED(c, "softmax_scale", "expected a finite positive value, got", "nan");
}

TEST(softmax_scale_must_be_finite) {
  Call c = make_call();
  c.options.softmax_scale = -std::numeric_limits<float>::infinity();
  EXPECT_REJECTED(c, "softmax_scale", "expected a finite positive value, got -inf");
}

TEST(softmax_scale_must_not_be_zero) {
  Call c = make_call();
  c.options.softmax_scale = 0.f;
  EXPECT_REJECTED(c, "softmax_scale", "expected a finite positive value, got 0");
}

TEST(softmax_scale_must_be_positive) {
  Call c = make_call();
  c.options.softmax_scale = -0.125f;
  EXPECT_REJECTED(c, "softmax_scale", "expected a finite positive value, got -0.125");
}

// ---------------------------------------------------------------- l. overlap

TEST(out_must_not_overlap_q) {
  Call c = make_call();
  c.out.data = fake_device_pointer(kQ + 4096);
  EXPECT_REJECTED(c, "out", "must not overlap q in memory", "[0x10000000, 0x1007ffff]");
}

TEST(out_must_not_overlap_k) {
  Call c = make_call();
  c.out.data = fake_device_pointer(kK - 16);  // out's last bytes run into k's first
  EXPECT_REJECTED(c, "out", "must not overlap k in memory");
}

TEST(out_must_not_overlap_v) {
  // A packed QKV tensor whose v part was also passed as out.
  Call c = make_call();
  c.out = c.v;
  c.out.shape[1] = 128;
  c.out.shape[2] = 8;
  c.out.stride[0] = 128 * 8 * 128;
  c.out.stride[1] = 8 * 128;
  EXPECT_REJECTED(c, "out", "must not overlap v in memory");
}

TEST(out_must_not_overlap_lse) {
  Call c = make_call();
  c.lse->data = fake_device_pointer(kOut + 1024);
  EXPECT_REJECTED(c, "out", "must not overlap lse in memory");
}

TEST(lse_must_not_overlap_q) {
  Call c = make_call();
  c.lse->data = fake_device_pointer(kQ + 64);
  EXPECT_REJECTED(c, "lse", "must not overlap q in memory");
}

TEST(lse_must_not_overlap_k) {
  Call c = make_call();
  c.lse->data = fake_device_pointer(kK + 2 * 256 * 2 * 128 * 2 - 4);  // k's last 4 bytes
  EXPECT_REJECTED(c, "lse", "must not overlap k in memory");
}

TEST(lse_must_not_overlap_v) {
  Call c = make_call();
  c.lse->data = fake_device_pointer(kV);
  EXPECT_REJECTED(c, "lse", "must not overlap v in memory");
}

// ---------------------------------------------------------------- m. written elements apart

TEST(out_heads_must_not_share_memory) {
  // stride[2] = 8 elements (16 bytes, a valid TMA stride) at head_dim 128: heads overlap.
  Call c = make_call();
  c.out.stride[2] = 8;
  EXPECT_REJECTED(c, "out", "stride[2] (heads) = 8 makes distinct elements share memory",
                  "already reach 127 elements");
}

TEST(out_rows_must_not_share_memory) {
  Call c = make_call();
  c.out.stride[1] = 128 * 4;  // room for 4 of the 8 heads per row
  EXPECT_REJECTED(c, "out", "stride[1] (seqlen) = 512 makes distinct elements share memory");
}

TEST(lse_rows_must_not_share_memory) {
  Call c = make_call();
  c.lse->stride[1] = 64;  // 128 rows per head, 64 apart
  EXPECT_REJECTED(c, "lse", "stride[1] (heads) = 64 makes distinct elements share memory");
}

TEST(valid_transposed_out_and_lse_do_not_share_memory) {
  // out as a (B, H, S, D) buffer seen as (B, S, H, D); lse as (B, S, H) seen as (B, H, S).
  Call c = make_call();
  c.out.stride[1] = 128;
  c.out.stride[2] = 128 * 128;
  c.lse->stride[1] = 1;
  c.lse->stride[2] = 8;
  EXPECT_VALID(c);
}

// ---------------------------------------------------------------- order and side effects

TEST(rank_is_checked_before_null_and_dtype) {
  Call c = make_call();
  c.k.data = nullptr;
  c.out.dtype = DType::f32;
  c.lse->rank = 2;
  EXPECT_REJECTED(c, "lse", "expected rank 3");
}

TEST(null_is_checked_before_dtype) {
  Call c = make_call();
  c.q.dtype = DType::f32;
  c.v.data = nullptr;
  EXPECT_REJECTED(c, "v", "data is null");
}

TEST(dtype_is_checked_before_head_dim_and_alignment) {
  Call c = make_call();
  c.q.shape[3] = c.k.shape[3] = c.v.shape[3] = c.out.shape[3] = 80;
  c.out.data = fake_device_pointer(kOut + 1);
  c.lse->dtype = DType::f16;
  EXPECT_REJECTED(c, "lse", "expected dtype float32");
}

TEST(rejected_call_writes_nothing) {
  // Real host memory for out and lse: forward must throw before any write. The call is wrong
  // only in its last-checked property but one (the scale), so out and lse go through every
  // other check first; then it is wrong early (k's dtype).
  Sizes s;
  s.batch = 1;
  s.seqlen_q = 4;
  s.seqlen_k = 8;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.head_dim = 64;
  alignas(16) uint16_t out_data[4 * 2 * 64];
  alignas(16) float lse_data[2 * 4];
  std::memset(out_data, 0xAB, sizeof out_data);
  std::memset(lse_data, 0xCD, sizeof lse_data);
  for (int variant = 0; variant < 2; ++variant) {
    Call c = make_call(s);
    c.out.data = out_data;
    c.lse->data = lse_data;
    if (variant == 0)
      c.options.softmax_scale = std::numeric_limits<float>::infinity();
    else
      c.k.dtype = DType::f16;
    const std::optional<std::string> message = error_of(c);
    CHECK(message.has_value()) << "variant " << variant;
    for (uint16_t x : out_data) CHECK(x == 0xABAB) << "variant " << variant << ": out written";
    for (float x : lse_data) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      CHECK(bits == 0xCDCDCDCDu) << "variant " << variant << ": lse written";
    }
  }
}

// ---------------------------------------------------------------- p. window, softcap, sinks

constexpr uintptr_t kSinks = 0x60000000;

TensorView sinks_view(int64_t heads, DType dtype = DType::f32, uintptr_t address = kSinks) {
  const int64_t shape[1] = {heads};
  return warpattn::make_contiguous_view(fake_device_pointer(address), dtype, 1, shape);
}

TEST(valid_window_softcap_and_sinks_pass_validation) {
  Call c = make_call();
  c.options.window_left = 128, c.options.window_right = 0;
  EXPECT_VALID(c);
  c.options.causal = true, c.options.window_right = -1;  // causal: right -1 or 0
  EXPECT_VALID(c);
  c.options.window_right = 0, c.options.softcap = 30.f, c.options.sinks = sinks_view(8);
  EXPECT_VALID(c);
  c.options.causal = false, c.options.window_left = -1, c.options.window_right = 1 << 30;  // wider than both: unbounded
  EXPECT_VALID(c);
}

TEST(window_sides_must_be_minus_one_or_more) {
  Call c = make_call();
  c.options.window_left = -2;
  EXPECT_REJECTED(c, "options.window_left", "expected -1 (unbounded) or a key count >= 0, got -2");
  c.options.window_left = 3, c.options.window_right = -7;
  EXPECT_REJECTED(c, "options.window_right", "got -7");
}

TEST(causal_window_may_not_reach_right_of_the_diagonal) {
  Call c = make_call();
  c.options.causal = true, c.options.window_left = 64, c.options.window_right = 3;
  EXPECT_REJECTED(c, "options.window_right", "expected -1 or 0 with causal, got 3");
}

TEST(softcap_must_be_zero_or_finite_positive) {
  Call c = make_call();
  c.options.softcap = -1.f;
  EXPECT_REJECTED(c, "options.softcap", "expected 0 (off) or a finite value > 0, got -1");
  c.options.softcap = std::numeric_limits<float>::quiet_NaN();
  EXPECT_REJECTED(c, "options.softcap", "got nan");
  c.options.softcap = std::numeric_limits<float>::infinity();
  EXPECT_REJECTED(c, "options.softcap", "got inf");
}

TEST(sinks_must_be_fp32_one_per_query_head) {
  Call c = make_call();
  c.options.sinks = sinks_view(8, DType::bf16);
  EXPECT_REJECTED(c, "sinks", "expected dtype float32, got bfloat16");
  c.options.sinks = sinks_view(2);
  EXPECT_REJECTED(c, "sinks", "expected shape (8) (one logit per query head), got (2)");
  const int64_t shape[2] = {8, 1};
  c.options.sinks = warpattn::make_contiguous_view(fake_device_pointer(kSinks), DType::f32, 2, shape);
  EXPECT_REJECTED(c, "sinks", "expected rank 1 (heads_q), got rank 2");
  c.options.sinks = sinks_view(8, DType::f32, 0);
  EXPECT_REJECTED(c, "sinks", "data is null");
  c.options.sinks = sinks_view(8, DType::f32, kSinks + 2);
  EXPECT_REJECTED(c, "sinks", "must be 4-byte aligned");
}

TEST(sinks_must_not_overlap_out) {
  Call c = make_call();
  c.options.sinks = sinks_view(8, DType::f32, kOut + 64);
  EXPECT_REJECTED(c, "out", "sinks");
}
