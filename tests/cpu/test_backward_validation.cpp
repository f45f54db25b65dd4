// warpattn::backward's argument validation (one test per rule and per distinct sub-case), its
// workspace size, and the C ABI's backward entries.
//
// As in test_validation.cpp the tensors carry fake device addresses, 256 MiB apart so that they
// never overlap unless a test makes them, and the checks go through validate_backward, which runs
// every rule of backward() and touches neither memory nor the GPU; the few calls of backward()
// itself stop before any launch (nothing to compute, an invalid argument, or the device checks
// refusing the fake addresses), so the suite passes on any machine.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "harness.hpp"
#include "hopper/backward/backward_block_m.hpp"
#include "warpattn/warpattn.hpp"
#include "warpattn/warpattn_c.h"

namespace {

using warpattn::DType;
using warpattn::TensorView;

constexpr uintptr_t kDout = 0x10000000, kQ = 0x20000000, kK = 0x30000000, kV = 0x40000000,
                    kOut = 0x50000000, kLse = 0x60000000, kDq = 0x70000000, kDk = 0x80000000,
                    kDv = 0x90000000, kWorkspace = 0xA0000000;
// Room for the default sizes' workspace (about 1 MiB) and more, below the next 256 MiB.
constexpr size_t kWorkspaceBytes = size_t(64) << 20;

void* at(uintptr_t address) { return reinterpret_cast<void*>(address); }

struct Sizes {
  int64_t batch = 2, seqlen_q = 128, seqlen_k = 256, heads_q = 8, heads_kv = 2, head_dim = 128;
};

struct Call {
  TensorView dout, q, k, v, out, lse, dq, dk, dv;
  warpattn::BackwardOptions options;
  std::optional<warpattn::Workspace> workspace;
};

// The tensors of a call by name, in argument order, for the tests that go over each of them.
struct NamedTensor {
  const char* name;
  TensorView Call::*member;
};
constexpr NamedTensor kTensors[9] = {{"dout", &Call::dout}, {"q", &Call::q},     {"k", &Call::k},
                                     {"v", &Call::v},       {"out", &Call::out}, {"lse", &Call::lse},
                                     {"dq", &Call::dq},     {"dk", &Call::dk},   {"dv", &Call::dv}};

// A valid call (contiguous tensors, a workspace of kWorkspaceBytes) of the given sizes.
Call make_call(const Sizes& s = {}, DType dtype = DType::bf16) {
  const int64_t q_shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.head_dim};
  const int64_t kv_shape[4] = {s.batch, s.seqlen_k, s.heads_kv, s.head_dim};
  const int64_t lse_shape[3] = {s.batch, s.heads_q, s.seqlen_q};
  Call c;
  c.dout = warpattn::make_contiguous_view(at(kDout), dtype, 4, q_shape);
  c.q = warpattn::make_contiguous_view(at(kQ), dtype, 4, q_shape);
  c.k = warpattn::make_contiguous_view(at(kK), dtype, 4, kv_shape);
  c.v = warpattn::make_contiguous_view(at(kV), dtype, 4, kv_shape);
  c.out = warpattn::make_contiguous_view(at(kOut), dtype, 4, q_shape);
  c.lse = warpattn::make_contiguous_view(at(kLse), DType::f32, 3, lse_shape);
  c.dq = warpattn::make_contiguous_view(at(kDq), dtype, 4, q_shape);
  c.dk = warpattn::make_contiguous_view(at(kDk), dtype, 4, kv_shape);
  c.dv = warpattn::make_contiguous_view(at(kDv), dtype, 4, kv_shape);
  c.workspace = warpattn::Workspace{at(kWorkspace), kWorkspaceBytes};
  return c;
}

// The message of the Error that validate_backward throws, or nullopt if the call is valid.
std::optional<std::string> validation_error(const Call& c) {
  try {
    warpattn::validate_backward(c.dout, c.q, c.k, c.v, c.out, c.lse, c.dq, c.dk, c.dv, c.options, c.workspace);
  } catch (const warpattn::Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// The message of the Error that backward itself throws, or nullopt if it returns.
std::optional<std::string> backward_error(const Call& c) {
  try {
    warpattn::backward(c.dout, c.q, c.k, c.v, c.out, c.lse, c.dq, c.dk, c.dv, c.options, c.workspace);
  } catch (const warpattn::Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// The call must be rejected with a message that starts with "<argument>: " and contains every
// one of `expected` (the expectation and what came).
void expect_rejected(const Call& c, const std::string& argument, std::initializer_list<const char*> expected,
                     int line) {
  const std::optional<std::string> message = validation_error(c);
  if (!message) {
    CHECK(false) << "line " << line << ": validate_backward accepted the call, expected an error about " << argument;
    return;
  }
  CHECK(message->rfind(argument + ": ", 0) == 0)
      << "line " << line << ": message should name " << argument << " first: " << *message;
  for (const char* text : expected)
    CHECK(message->find(text) != std::string::npos) << "line " << line << ": missing \"" << text << "\" in: " << *message;
}
#define EXPECT_REJECTED(call, argument, ...) expect_rejected(call, argument, {__VA_ARGS__}, __LINE__)

void expect_valid(const Call& c, int line) {
  const std::optional<std::string> message = validation_error(c);
  CHECK(!message) << "line " << line << ": expected a valid call, got: " << *message;
}
#define EXPECT_VALID(call) expect_valid(call, __LINE__)

size_t workspace_bytes(const Call& c) { return warpattn::backward_workspace_bytes(c.q, c.options); }

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Where the device checks stop a valid call with fake addresses: without a GPU, no device;
// with one, the first tensor checked (dout) is not device memory.
bool stopped_at_device_checks(const std::string& message) {
  return starts_with(message, "no CUDA device with compute capability 9.0 (Hopper) found: ") ||
         starts_with(message, "dout: expected device memory, got an address CUDA does not know");
}

warpattn_tensor to_c(const TensorView& t) {
  warpattn_tensor c{};
  c.data = t.data;
  c.dtype = static_cast<int>(t.dtype);
  c.rank = t.rank;
  for (int i = 0; i < 4; ++i) {
    c.shape[i] = t.shape[i];
    c.stride[i] = t.stride[i];
  }
  return c;
}

// warpattn_backward on `c`, with dq replaced by `dq` (which may be NULL); the message in `err`.
int c_backward(const Call& c, const warpattn_tensor* dq, char* err, size_t err_len) {
  const warpattn_tensor dout = to_c(c.dout), q = to_c(c.q), k = to_c(c.k), v = to_c(c.v), out = to_c(c.out),
                        lse = to_c(c.lse), dk = to_c(c.dk), dv = to_c(c.dv);
  return warpattn_backward(&dout, &q, &k, &v, &out, &lse, dq, &dk, &dv, c.options.softmax_scale.has_value(),
                           c.options.softmax_scale.value_or(0.f), c.options.causal, c.options.deterministic,
                           c.workspace ? c.workspace->data : nullptr, c.workspace ? c.workspace->bytes : 0, nullptr,
                           err, err_len);
}

}  // namespace

// ---------------------------------------------------------------- valid calls

TEST(backward_valid_variants_pass_validation) {
  EXPECT_VALID(make_call());
  EXPECT_VALID(make_call({}, DType::f16));
  Call options = make_call();
  options.options.causal = true;
  options.options.deterministic = true;
  options.options.softmax_scale = 0.25f;
  EXPECT_VALID(options);
  for (int64_t d : {64, 128, 256}) {
    Sizes s;
    s.head_dim = d;
    EXPECT_VALID(make_call(s));
  }
  Sizes mha, mqa;
  mha.heads_kv = 8;
  mqa.heads_kv = 1;
  EXPECT_VALID(make_call(mha));
  EXPECT_VALID(make_call(mqa));
  Call no_workspace = make_call();
  no_workspace.workspace.reset();
  EXPECT_VALID(no_workspace);
}

TEST(backward_valid_workspace_of_exactly_the_needed_bytes) {
  for (bool deterministic : {false, true}) {
    Call c = make_call();
    c.options.deterministic = deterministic;
    c.workspace->bytes = workspace_bytes(c);
    EXPECT_VALID(c);
  }
}

TEST(backward_valid_padded_and_transposed_strides) {
  // k, v, dk as slices of packed tensors (strides multiples of 16 bytes); dq as a (B, H, S, D)
  // buffer seen as (B, S, H, D); lse as (B, S, H) seen as (B, H, S).
  Call c = make_call();
  for (TensorView* t : {&c.k, &c.v, &c.dk}) {
    t->stride[2] = 136;
    t->stride[1] = 2 * 136 + 8;
    t->stride[0] = 256 * t->stride[1];
  }
  c.dq.stride[1] = 128;
  c.dq.stride[2] = 128 * 128;
  c.lse.stride[1] = 1;
  c.lse.stride[2] = 8;
  EXPECT_VALID(c);
}

TEST(backward_valid_empty_sequences_need_no_memory) {
  // No query rows: dk and dv are zero, q, out, dout, dq and lse empty (null is fine), and the
  // workspace has no byte to hold (null is fine too).
  Sizes no_queries;
  no_queries.seqlen_q = 0;
  Call c = make_call(no_queries);
  c.dout.data = c.q.data = c.out.data = c.lse.data = c.dq.data = nullptr;
  CHECK(workspace_bytes(c) == 0) << workspace_bytes(c);
  c.workspace = warpattn::Workspace{nullptr, 0};
  EXPECT_VALID(c);
  // No keys: dq is zero; k, v, dk, dv empty.
  Sizes no_keys;
  no_keys.seqlen_k = 0;
  Call d = make_call(no_keys);
  d.k.data = d.v.data = d.dk.data = d.dv.data = nullptr;
  EXPECT_VALID(d);
}

// ---------------------------------------------------------------- backward() itself

TEST(backward_with_nothing_to_compute_returns_without_gpu) {
  Sizes no_batch;
  no_batch.batch = 0;
  Sizes no_heads;
  no_heads.heads_q = no_heads.heads_kv = 0;
  Sizes no_sequences;
  no_sequences.seqlen_q = no_sequences.seqlen_k = 0;
  for (const Sizes& s : {no_batch, no_heads, no_sequences}) {
    Call c = make_call(s);
    for (const NamedTensor& t : kTensors) (c.*t.member).data = nullptr;
    c.workspace.reset();
    const std::optional<std::string> message = backward_error(c);
    CHECK(!message) << *message;
  }
}

TEST(backward_with_an_empty_sequence_goes_on_to_the_device) {
  // One sequence empty still has a gradient to write (zeros), so the call must not return early.
  Sizes no_queries;
  no_queries.seqlen_q = 0;
  const std::optional<std::string> message = backward_error(make_call(no_queries));
  REQUIRE(message.has_value());
  CHECK(starts_with(*message, "no CUDA device with compute capability 9.0 (Hopper) found: ") ||
        starts_with(*message, "k: expected device memory"))
      << *message;
}

TEST(backward_valid_call_stops_at_the_device_checks) {
  for (bool with_workspace : {true, false}) {
    Call c = make_call();
    if (!with_workspace) c.workspace.reset();
    const std::optional<std::string> message = backward_error(c);
    REQUIRE(message.has_value());
    CHECK(stopped_at_device_checks(*message)) << *message;
  }
}

TEST(backward_rejects_an_invalid_call_before_the_device) {
  Call c = make_call();
  c.dq.data = at(kQ + 4096);
  const std::optional<std::string> message = backward_error(c);
  REQUIRE(message.has_value());
  CHECK(starts_with(*message, "dq: must not overlap q in memory")) << *message;
  CHECK(message == validation_error(c));
}

// ---------------------------------------------------------------- a. rank

TEST(backward_rank_of_every_tensor) {
  for (const NamedTensor& t : kTensors) {
    Call c = make_call();
    const bool is_lse = std::strcmp(t.name, "lse") == 0;
    (c.*t.member).rank = is_lse ? 4 : 3;
    if (is_lse)
      EXPECT_REJECTED(c, t.name, "expected rank 3 (batch, heads, seqlen_q), got rank 4");
    else
      EXPECT_REJECTED(c, t.name, "expected rank 4 (batch, seqlen, heads, head_dim), got rank 3");
  }
}

// ---------------------------------------------------------------- b. negative sizes

TEST(backward_negative_size) {
  Call c = make_call();
  c.dk.shape[1] = -3;
  EXPECT_REJECTED(c, "dk", "shape[1] (seqlen) must not be negative, got -3");
}

// ---------------------------------------------------------------- c. null pointers

TEST(backward_null_data_of_every_tensor) {
  for (const NamedTensor& t : kTensors) {
    Call c = make_call();
    (c.*t.member).data = nullptr;
    EXPECT_REJECTED(c, t.name, "data is null, expected a device pointer for a non-empty tensor");
  }
}

// ---------------------------------------------------------------- d. dtypes

TEST(backward_q_must_be_float16_or_bfloat16) {
  Call c = make_call();
  c.q.dtype = DType::f32;
  EXPECT_REJECTED(c, "q", "expected dtype float16 or bfloat16, got float32");
}

TEST(backward_dtype_of_every_16_bit_tensor_must_match_q) {
  for (const NamedTensor& t : kTensors) {
    if (std::strcmp(t.name, "q") == 0 || std::strcmp(t.name, "lse") == 0) continue;
    Call c = make_call();
    (c.*t.member).dtype = DType::f16;
    EXPECT_REJECTED(c, t.name, "expected dtype bfloat16 (same as q), got float16");
  }
}

TEST(backward_lse_must_be_float32) {
  Call c = make_call();
  c.lse.dtype = DType::bf16;
  EXPECT_REJECTED(c, "lse", "expected dtype float32, got bfloat16");
}

// ---------------------------------------------------------------- e. head dimension

TEST(backward_unsupported_head_dim) {
  for (int64_t d : {100, 4, 520, 0, 12, 516}) {
    Sizes s;
    s.head_dim = d;
    const std::string got = ", got " + std::to_string(d);
    // The backward's sizes are the forward's, so whichever of the two checks comes first may
    // answer: the message is not pinned to " for the backward".
    EXPECT_REJECTED(make_call(s), "q", "head_dim (shape[3]) must be a multiple of 8 from 8 to 512", got.c_str());
  }
}

// The backward runs the forward's padded sizes too (in its 64, 128, 256 or 512 kernel, the
// missing columns zero-filled), up to 512 as the dense forward.
TEST(backward_padded_head_dims_pass_validation) {
  for (int64_t d : {8, 40, 72, 80, 96, 112, 136, 200, 248, 256, 264, 384, 488, 504, 512}) {
    Sizes s;
    s.head_dim = d;
    EXPECT_VALID(make_call(s));
    EXPECT_VALID(make_call(s, DType::f16));
  }
}

TEST(backward_head_dim_must_match_q) {
  Call c = make_call();
  c.dv.shape[3] = 64;
  EXPECT_REJECTED(c, "dv", "expected head_dim 128 (same as v), got 64");
  c = make_call();
  c.dq.shape[3] = 64;
  EXPECT_REJECTED(c, "dq", "expected head_dim 128 (same as q), got 64");
}

// MLA's prefill shape: q, k, dq, dk 192; v, out, dout, dv 128.
TEST(backward_value_head_dim_may_differ) {
  Sizes s;
  s.head_dim = 192;
  Call c = make_call(s);
  for (TensorView* t : {&c.v, &c.out, &c.dout, &c.dv}) t->shape[3] = 128;
  EXPECT_VALID(c);
  c.dout.shape[3] = 192;
  EXPECT_REJECTED(c, "dout", "expected head_dim 128 (same as v), got 192");
}

// ---------------------------------------------------------------- f. batch and shapes

TEST(backward_batch_must_match_q) {
  Call c = make_call();
  c.dout.shape[0] = 3;
  EXPECT_REJECTED(c, "dout", "expected batch 2 (same as q), got 3");
}

TEST(backward_dk_and_dv_shape_must_be_k_shape) {
  Call c = make_call();
  c.dk.shape[1] = 255;
  EXPECT_REJECTED(c, "dk", "expected shape (2, 256, 2, 128) (same as k), got (2, 255, 2, 128)");
  Call d = make_call();
  d.dv.shape[2] = 1;
  EXPECT_REJECTED(d, "dv", "expected shape (2, 256, 2, 128) (same as k), got (2, 256, 1, 128)");
}

TEST(backward_dq_dout_and_out_shape_must_be_q_shape) {
  Call c = make_call();
  c.dq.shape[2] = 2;
  EXPECT_REJECTED(c, "dq", "expected shape (2, 128, 8, 128) (same as q), got (2, 128, 2, 128)");
  Call d = make_call();
  d.dout.shape[1] = 64;
  EXPECT_REJECTED(d, "dout", "expected shape (2, 128, 8, 128) (same as q), got (2, 64, 8, 128)");
  Call o = make_call();
  o.out.shape[1] = 127;
  EXPECT_REJECTED(o, "out", "(same as q), got (2, 127, 8, 128)");
}

TEST(backward_lse_shape_must_be_batch_heads_seqlen) {
  Call c = make_call();
  c.lse.shape[1] = 128;
  c.lse.shape[2] = 8;
  EXPECT_REJECTED(c, "lse", "expected shape (batch, heads_q, seqlen_q) = (2, 8, 128), got (2, 128, 8)");
}

// ---------------------------------------------------------------- g. heads

TEST(backward_query_heads_must_be_a_multiple_of_kv_heads) {
  Sizes s;
  s.heads_kv = 3;
  EXPECT_REJECTED(make_call(s), "k", "query heads (8) must be a multiple of key/value heads (3)");
}

TEST(backward_kv_heads_need_query_heads) {
  // dk and dv are written through their query heads: without any, nothing would write them.
  Sizes s;
  s.heads_q = 0;
  EXPECT_REJECTED(make_call(s), "k", "expected 0 key/value heads for 0 query heads", "got 2");
}

// ---------------------------------------------------------------- h. contiguous last dimension

TEST(backward_dq_last_dim_must_be_contiguous) {
  Call c = make_call();
  c.dq.stride[3] = 2;
  EXPECT_REJECTED(c, "dq", "last dimension (head_dim) must be contiguous (stride[3] == 1), got stride[3] = 2");
}

// ---------------------------------------------------------------- i. alignment and strides

TEST(backward_misaligned_dq) {
  Call c = make_call();
  c.dq.data = at(kDq + 8);
  EXPECT_REJECTED(c, "dq", "data pointer 0x70000008 must be 16-byte aligned (TMA)");
}

TEST(backward_dout_stride_must_be_a_multiple_of_16_bytes) {
  Call c = make_call();
  c.dout.stride[2] = 129;
  EXPECT_REJECTED(c, "dout", "stride[2] (heads) = 129 elements = 258 bytes must be a multiple of 16 bytes (TMA)");
}

TEST(backward_lse_needs_4_byte_alignment_and_positive_strides) {
  Call c = make_call();
  c.lse.data = at(kLse + 4);
  EXPECT_VALID(c);
  c.lse.data = at(kLse + 2);
  EXPECT_REJECTED(c, "lse", "data pointer 0x60000002 must be 4-byte aligned");
  Call negative = make_call();
  negative.lse.stride[2] = -1;
  EXPECT_REJECTED(negative, "lse", "stride[2] (seqlen_q) must not be negative, got -1");
  Call zero = make_call();
  zero.lse.stride[2] = 0;
  EXPECT_REJECTED(zero, "lse", "stride[2] (seqlen_q) must be positive for a dimension of size 128, got 0");
}

// ---------------------------------------------------------------- j. 32-bit coordinates

TEST(backward_seqlen_must_fit_32_bit_coordinates) {
  Sizes s;
  s.seqlen_k = int64_t(1) << 31;
  Call c = make_call(s);
  for (TensorView* t : {&c.k, &c.v, &c.dk, &c.dv}) t->stride[0] = 8;  // legal strides; only the size is wrong
  EXPECT_REJECTED(c, "k", "seqlen (shape[1]) = 2147483648 must be less than 2^31");
}

// ---------------------------------------------------------------- k. softmax scale

TEST(backward_softmax_scale_must_be_finite_and_positive) {
  for (float scale : {0.f, -0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Call c = make_call();
    c.options.softmax_scale = scale;
    EXPECT_REJECTED(c, "softmax_scale", "expected a finite positive value, got");
  }
}

// ---------------------------------------------------------------- l. overlap

TEST(backward_dq_must_not_overlap_q) {
  Call c = make_call();
  c.dq.data = at(kQ + 4096);
  EXPECT_REJECTED(c, "dq", "must not overlap q in memory", "[0x20000000, 0x2007ffff]");
}

TEST(backward_gradients_must_not_overlap_what_is_read) {
  Call dq_dout = make_call();
  dq_dout.dq.data = at(kDout);
  EXPECT_REJECTED(dq_dout, "dq", "must not overlap dout in memory");
  Call dk_k = make_call();
  dk_k.dk.data = at(kK + 2 * 256 * 2 * 128 * 2 - 16);  // dk's first bytes on k's last
  EXPECT_REJECTED(dk_k, "dk", "must not overlap k in memory");
  Call dv_lse = make_call();
  dv_lse.lse.data = at(kDv + 1024);
  EXPECT_REJECTED(dv_lse, "dv", "must not overlap lse in memory");
}

TEST(backward_gradients_must_not_overlap_one_another) {
  Call dk_dv = make_call();
  dk_dv.dv.data = at(kDk + 256);
  EXPECT_REJECTED(dk_dv, "dk", "must not overlap dv in memory");
  Call dq_dk = make_call();
  dq_dk.dk.data = at(kDq);
  EXPECT_REJECTED(dq_dk, "dq", "must not overlap dk in memory");
}

// ---------------------------------------------------------------- m. written elements apart

TEST(backward_dq_self_overlap) {
  Call c = make_call();
  c.dq.stride[2] = 8;  // 16 bytes, a valid TMA stride, but heads of 128 elements overlap
  EXPECT_REJECTED(c, "dq", "stride[2] (heads) = 8 makes distinct elements share memory", "already reach 127 elements");
}

TEST(backward_dv_rows_must_not_share_memory) {
  Call c = make_call();
  c.dv.stride[1] = 128;  // room for one of the two heads per row: row s's second head is row s + 1's first
  EXPECT_REJECTED(c, "dv", "stride[2] (heads) = 128 makes distinct elements share memory");
}

// ---------------------------------------------------------------- n. workspace

TEST(backward_workspace_too_small) {
  Call c = make_call();
  const size_t needed = workspace_bytes(c);
  c.workspace->bytes = needed - 1;
  const std::string expected = "expected at least " + std::to_string(needed) + " bytes (backward_workspace_bytes), got " +
                               std::to_string(needed - 1);
  EXPECT_REJECTED(c, "workspace", expected.c_str());
  // The deterministic mode's turn counters need more than the default's size.
  Call d = make_call();
  d.workspace->bytes = needed;
  d.options.deterministic = true;
  EXPECT_REJECTED(d, "workspace", "expected at least", "(backward_workspace_bytes), got");
}

TEST(backward_workspace_misaligned) {
  Call c = make_call();
  c.workspace->data = at(kWorkspace + 128);
  EXPECT_REJECTED(c, "workspace", "data pointer 0xa0000080 must be 256-byte aligned");
}

TEST(backward_workspace_null) {
  Call c = make_call();
  c.workspace->data = nullptr;
  EXPECT_REJECTED(c, "workspace", "data is null, expected a device pointer to at least");
}

TEST(backward_workspace_must_not_overlap_any_tensor) {
  Call inside = make_call();
  inside.dq.data = at(kWorkspace + kWorkspaceBytes / 2);
  EXPECT_REJECTED(inside, "workspace", "must not overlap dq in memory");
  // The whole range given counts, beyond the bytes needed: the call may use it.
  Call beyond_needed = make_call();
  beyond_needed.workspace->data = at(kQ - kWorkspaceBytes + 256);
  EXPECT_REJECTED(beyond_needed, "workspace", "must not overlap q in memory");
  Call lse = make_call();
  lse.workspace->data = at(kLse);
  EXPECT_REJECTED(lse, "workspace", "must not overlap lse in memory");
}

// ---------------------------------------------------------------- order

TEST(backward_rank_is_checked_before_null_and_dtype) {
  Call c = make_call();
  c.dq.data = nullptr;
  c.dout.dtype = DType::f32;
  c.dv.rank = 2;
  EXPECT_REJECTED(c, "dv", "expected rank 4");
}

TEST(backward_tensors_are_checked_before_the_workspace) {
  Call c = make_call();
  c.workspace->bytes = 1;
  c.options.softmax_scale = -1.f;
  EXPECT_REJECTED(c, "softmax_scale", "expected a finite positive value");
}

// ---------------------------------------------------------------- backward_workspace_bytes

TEST(backward_workspace_bytes_grows_with_deterministic_and_seqlen) {
  Call c = make_call();
  const size_t base = workspace_bytes(c);
  // At least dQ's fp32 accumulator.
  CHECK(base >= size_t(2) * 128 * 8 * 128 * 4) << base;
  c.options.deterministic = true;
  CHECK(workspace_bytes(c) > base) << workspace_bytes(c) << " vs " << base;
  Sizes longer;
  longer.seqlen_q = 4096;
  const size_t longer_bytes = workspace_bytes(make_call(longer));
  CHECK(longer_bytes > base) << longer_bytes << " vs " << base;
  CHECK(longer_bytes >= size_t(2) * 4096 * 8 * 128 * 4) << longer_bytes;
}

// Above 256 the 512 kernel's workspace: dQ's accumulator has its 512 columns whatever the head
// dim between (264 needs what 512 does), and the deterministic turn counters are one per 32 rows
// (its query blocks), twice the d = 256 kernel's one per 64.
TEST(backward_workspace_bytes_at_head_dims_above_256) {
  Sizes s;
  s.seqlen_q = 4096;  // 2 x 8 heads x 4096 rows: every region a multiple of 256 bytes
  s.head_dim = 512;
  Call c512 = make_call(s);
  s.head_dim = 264;
  Call c264 = make_call(s);
  s.head_dim = 256;
  Call c256 = make_call(s);
  const size_t b512 = workspace_bytes(c512), b264 = workspace_bytes(c264), b256 = workspace_bytes(c256);
  CHECK(b264 == b512) << b264 << " vs " << b512;
  CHECK(b512 >= size_t(2) * 4096 * 8 * 512 * 4) << b512;
  CHECK(b512 - b256 == size_t(2) * 4096 * 8 * 256 * 4) << b512 << " - " << b256;  // only dQ's columns differ
  c512.options.deterministic = c256.options.deterministic = true;
  CHECK(workspace_bytes(c512) - b512 == size_t(2) * 8 * 4096 / 32 * 4) << workspace_bytes(c512) << " - " << b512;
  CHECK(workspace_bytes(c256) - b256 == size_t(2) * 8 * 4096 / 64 * 4) << workspace_bytes(c256) << " - " << b256;
}

TEST(backward_workspace_bytes_checks_rank_and_sizes_only) {
  Call c = make_call();
  c.q.dtype = DType::f32;  // not its business
  c.q.data = nullptr;
  CHECK(workspace_bytes(c) > 0);
  auto error = [](const TensorView& q) -> std::string {
    try {
      warpattn::backward_workspace_bytes(q, {});
    } catch (const warpattn::Error& e) {
      return e.what();
    }
    return "";
  };
  Call rank = make_call();
  rank.q.rank = 3;
  CHECK(starts_with(error(rank.q), "q: expected rank 4 (batch, seqlen, heads, head_dim), got rank 3")) << error(rank.q);
  Call negative = make_call();
  negative.q.shape[1] = -1;
  CHECK(starts_with(error(negative.q), "q: shape[1] (seqlen) must not be negative, got -1")) << error(negative.q);
  // A size whose workspace would overflow the layout's arithmetic is refused, not wrapped.
  Call absurd = make_call();
  absurd.q.shape[0] = absurd.q.shape[1] = absurd.q.shape[2] = int64_t(1) << 30;
  CHECK(starts_with(error(absurd.q), "q: shape (1073741824, 1073741824, 1073741824, 128) needs a backward workspace of more than 2^62 bytes"))
      << error(absurd.q);
}

// ---------------------------------------------------------------- the C ABI

TEST(c_backward_returns_invalid_with_the_message) {
  Call c = make_call();
  c.dq.data = at(kQ + 4096);
  const warpattn_tensor dq = to_c(c.dq);
  char err[512];
  std::memset(err, 'x', sizeof err);
  CHECK(c_backward(c, &dq, err, sizeof err) == WARPATTN_INVALID);
  CHECK(validation_error(c) == std::string(err)) << err;
  // A NULL tensor, an unknown dtype code: refused the same way, never thrown.
  CHECK(c_backward(c, nullptr, err, sizeof err) == WARPATTN_INVALID);
  CHECK(std::string(err) == "dq: expected a tensor, got NULL") << err;
  warpattn_tensor bad_dtype = to_c(make_call().dq);
  bad_dtype.dtype = 9;
  CHECK(c_backward(make_call(), &bad_dtype, err, sizeof err) == WARPATTN_INVALID);
  CHECK(starts_with(err, "dq.dtype: expected 0 (f16), 1 (bf16), 2 (f32) or 5 (s32), got 9")) << err;
  // The message is cut to the buffer and terminated; no buffer at all is fine.
  char small[8];
  CHECK(c_backward(c, &dq, small, sizeof small) == WARPATTN_INVALID);
  CHECK(std::string(small) == "dq: mus") << small;
  CHECK(c_backward(c, &dq, nullptr, 0) == WARPATTN_INVALID);
}

TEST(c_backward_valid_call_stops_at_the_device_checks) {
  const Call c = make_call();
  const warpattn_tensor dq = to_c(c.dq);
  char err[512];
  CHECK(c_backward(c, &dq, err, sizeof err) == WARPATTN_INVALID);
  CHECK(stopped_at_device_checks(err)) << err;
}

// warpattn_forward_ex's options through the backward: the window, softcap and sinks reach
// validation (sinks need dsinks), a struct not filled by the init function is
// refused before it is read further.
TEST(c_backward_ex_takes_the_forward_options) {
  const Call c = make_call();
  const warpattn_tensor dout = to_c(c.dout), q = to_c(c.q), k = to_c(c.k), v = to_c(c.v), out = to_c(c.out),
                        lse = to_c(c.lse), dq = to_c(c.dq), dk = to_c(c.dk), dv = to_c(c.dv);
  warpattn_forward_options o;
  warpattn_forward_options_init(&o);
  CHECK(o.struct_size == sizeof o && o.window_left == -1 && o.window_right == -1 && o.sinks == nullptr);
  char err[512];
  const auto run = [&](const warpattn_forward_options* options) {
    return warpattn_backward_ex(&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv, nullptr, options, 0, nullptr, 0,
                                nullptr, err, sizeof err);
  };
  o.window_left = 64, o.window_right = 0;
  CHECK(run(&o) == WARPATTN_INVALID);
  CHECK(stopped_at_device_checks(err)) << err;  // every argument rule passed
  o.window_left = -3;
  CHECK(run(&o) == WARPATTN_INVALID);
  CHECK(starts_with(err, "options.window_left: expected -1 (unbounded) or a key count >= 0, got -3")) << err;
  o.window_left = 64, o.softcap = 30.f;
  CHECK(run(&o) == WARPATTN_INVALID);
  CHECK(stopped_at_device_checks(err)) << err;
  o.softcap = -2.f;
  CHECK(run(&o) == WARPATTN_INVALID);
  CHECK(starts_with(err, "options.softcap: expected 0 (off) or a finite value > 0, got -2")) << err;
  o.softcap = 0.f;
  warpattn_tensor sinks{};
  sinks.data = at(kQ - 4096), sinks.dtype = WARPATTN_DTYPE_F32, sinks.rank = 1, sinks.shape[0] = 8, sinks.stride[0] = 1;
  o.sinks = &sinks;  // without dsinks
  CHECK(run(&o) == WARPATTN_INVALID);
  CHECK(starts_with(err, "dsinks: expected a (heads_q) float32 tensor for the sinks' gradient, got none")) << err;
  // The workspace grows by the sinks' per-block sums: one float per 64 of the padded rows (whole
  // granules: 320 rows at d = 128, whose kernel walks 80-row blocks without a mask).
  size_t with = 0, without = 0;
  CHECK(warpattn_backward_ex_workspace_bytes(&q, &o, 0, &with, err, sizeof err) == WARPATTN_OK) << err;
  o.sinks = nullptr;
  CHECK(warpattn_backward_ex_workspace_bytes(&q, &o, 0, &without, err, sizeof err) == WARPATTN_OK) << err;
  const Sizes s;
  const int64_t granule = warpattn::detail::backward_row_granule(128);
  const int64_t blocks = (s.seqlen_q + granule - 1) / granule * granule / 64;
  CHECK(with > without && int64_t(with - without) <= 4 * s.heads_q * s.batch * blocks + 256) << with << " " << without;
  CHECK(run(nullptr) == WARPATTN_INVALID);
  CHECK(starts_with(err, "options: expected a warpattn_forward_options, got NULL")) << err;
  warpattn_forward_options zeroed{};
  CHECK(run(&zeroed) == WARPATTN_INVALID);
  CHECK(starts_with(err, "options: struct_size 0 is smaller than any version")) << err;
}

TEST(c_backward_workspace_bytes) {
  Call c = make_call();
  c.options.deterministic = true;
  const warpattn_tensor q = to_c(c.q);
  char err[256] = "stale";
  size_t bytes = 0;
  CHECK(warpattn_backward_workspace_bytes(&q, 0, 1, &bytes, err, sizeof err) == WARPATTN_OK);
  CHECK(bytes == workspace_bytes(c)) << bytes;
  CHECK(err[0] == '\0') << err;
  warpattn_tensor rank3 = q;
  rank3.rank = 3;
  bytes = 7;
  CHECK(warpattn_backward_workspace_bytes(&rank3, 0, 0, &bytes, err, sizeof err) == WARPATTN_INVALID);
  CHECK(starts_with(err, "q: expected rank 4")) << err;
  CHECK(bytes == 7) << bytes;
  CHECK(warpattn_backward_workspace_bytes(&q, 0, 0, nullptr, err, sizeof err) == WARPATTN_INVALID);
  CHECK(std::string(err) == "bytes: expected a pointer to receive the size, got NULL") << err;
  CHECK(warpattn_backward_workspace_bytes(nullptr, 0, 0, &bytes, err, sizeof err) == WARPATTN_INVALID);
  CHECK(std::string(err) == "q: expected a tensor, got NULL") << err;
}

// ---------------------------------------------------------------- the window and softcap

TEST(backward_window_and_softcap_rules) {
  Call c = make_call();
  c.options.window_left = 64, c.options.window_right = 0, c.options.softcap = 30.f;
  EXPECT_VALID(c);
  c.options.window_right = -4;
  EXPECT_REJECTED(c, "options.window_right", "expected -1 (unbounded) or a key count >= 0, got -4");
  c.options.window_right = 0, c.options.causal = true, c.options.window_right = 2;
  EXPECT_REJECTED(c, "options.window_right", "expected -1 or 0 with causal, got 2");
  c.options.window_right = 0, c.options.softcap = -1.f;
  EXPECT_REJECTED(c, "options.softcap", "expected 0 (off) or a finite value > 0, got -1");
  // Softcap at every head dim: the 64 kernel has none, so at 8 to 64 the 128 kernel runs it, and
  // the workspace is sized for the 128 kernel's columns (dQ's accumulator).
  for (int64_t d : {8, 32, 48, 56, 64}) {
    Sizes small;
    small.head_dim = d;
    Call cd = make_call(small);
    cd.options.softcap = 30.f;
    EXPECT_VALID(cd);
    warpattn::BackwardOptions plain = cd.options, capped = cd.options;
    plain.softcap = 0.f;
    const TensorView q_d = cd.q;
    TensorView q_128 = cd.q;
    q_128.shape[3] = 128;
    CHECK(warpattn::backward_workspace_bytes(q_d, capped) == warpattn::backward_workspace_bytes(q_128, plain))
        << "d=" << d << ": softcap's workspace is not the 128 kernel's";
    CHECK(warpattn::backward_workspace_bytes(q_d, capped) > warpattn::backward_workspace_bytes(q_d, plain)) << d;
  }
  for (int64_t d : {72, 80, 200}) {
    Sizes padded;
    padded.head_dim = d;
    Call cd = make_call(padded);
    cd.options.softcap = 30.f;
    EXPECT_VALID(cd);
  }
}

TEST(backward_sinks_need_their_gradient) {
  const int64_t shape[1] = {8};
  Call c = make_call();
  const TensorView sinks = warpattn::make_contiguous_view(at(kQ - 4096), DType::f32, 1, shape);
  const TensorView dsinks = warpattn::make_contiguous_view(at(kQ - 8192), DType::f32, 1, shape);
  c.options.dsinks = dsinks;
  EXPECT_REJECTED(c, "dsinks", "given without sinks");
  c.options.sinks = sinks;
  EXPECT_VALID(c);
  const int64_t two[1] = {2};
  c.options.dsinks = warpattn::make_contiguous_view(at(kQ - 8192), DType::f32, 1, two);
  EXPECT_REJECTED(c, "dsinks", "expected shape (8) (one per query head), got (2)");
  c.options.dsinks = warpattn::make_contiguous_view(at(kQ), DType::f32, 1, shape);  // inside q
  EXPECT_REJECTED(c, "dsinks", "must not overlap q");
}
