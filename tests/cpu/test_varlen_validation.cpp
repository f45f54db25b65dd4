// warpattn::forward_varlen's argument validation: the packed tensors' rules (forward()'s, in
// the caller's numbering of dimensions) and the offsets' rules, each rejected before anything
// touches memory or the GPU (fake device addresses, as test_validation.cpp).
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "expect_rejected.hpp"
#include "harness.hpp"
#include "hopper/backward/backward_block_m.hpp"
#include "warpattn/warpattn.hpp"

namespace {

using warpattn::DType;
using warpattn::TensorView;

void* fake(uintptr_t address) { return reinterpret_cast<void*>(address); }

struct Call {
  TensorView q, k, v, out;
  std::optional<TensorView> lse;
  warpattn::VarlenBatch batch;
  warpattn::ForwardOptions options;
};

// A valid call: 3 sequences packed into total_q = 300 query rows and total_k = 500 keys.
Call make_call(int64_t total_q = 300, int64_t total_k = 500, int64_t sequences = 3) {
  const int64_t q_shape[3] = {total_q, 8, 128}, kv_shape[3] = {total_k, 2, 128}, lse_shape[2] = {8, total_q};
  const int64_t offsets_shape[1] = {sequences + 1}, used_shape[1] = {sequences};
  Call c;
  c.q = warpattn::make_contiguous_view(fake(0x10000000), DType::bf16, 3, q_shape);
  c.k = warpattn::make_contiguous_view(fake(0x20000000), DType::bf16, 3, kv_shape);
  c.v = warpattn::make_contiguous_view(fake(0x30000000), DType::bf16, 3, kv_shape);
  c.out = warpattn::make_contiguous_view(fake(0x40000000), DType::bf16, 3, q_shape);
  c.lse = warpattn::make_contiguous_view(fake(0x50000000), DType::f32, 2, lse_shape);
  c.batch.cu_seqlens_q = warpattn::make_contiguous_view(fake(0x60000000), DType::s32, 1, offsets_shape);
  c.batch.cu_seqlens_k = warpattn::make_contiguous_view(fake(0x70000000), DType::s32, 1, offsets_shape);
  c.batch.seqused_k = warpattn::make_contiguous_view(fake(0x80000000), DType::s32, 1, used_shape);
  c.batch.max_seqlen_q = 200, c.batch.max_seqlen_k = 300;
  return c;
}

std::optional<std::string> error_of(const Call& c) {
  try {
    warpattn::validate_forward_varlen(c.q, c.k, c.v, c.out, c.lse, c.batch, c.options);
  } catch (const warpattn::Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}


}  // namespace

TEST(varlen_valid_calls) {
  Call c = make_call();
  CHECK(!error_of(c)) << *error_of(c);
  c.lse.reset();
  c.batch.seqused_k.reset();
  CHECK(!error_of(c)) << *error_of(c);
  Call empty = make_call(0, 0, 0);  // no sequence at all
  CHECK(!error_of(empty)) << *error_of(empty);
  // forward_varlen itself returns at once on it (nothing to compute, no GPU needed)
  try {
    warpattn::forward_varlen(empty.q, empty.k, empty.v, empty.out, empty.lse, empty.batch, empty.options);
  } catch (const warpattn::Error& e) {
    CHECK(false) << e.what();
  }
}

TEST(varlen_tensor_rules_in_the_callers_numbering) {
  Call c = make_call();
  c.q.rank = 4;
  EXPECT_REJECTED(c, "q", "expected rank 3 (total, heads, head_dim)", "got rank 4");
  c = make_call();
  c.lse->rank = 3;
  EXPECT_REJECTED(c, "lse", "expected rank 2 (heads, total_q)");
  c = make_call();
  c.q.shape[2] = 100, c.q.stride[1] = 104, c.q.stride[0] = 8 * 104;  // rows padded to 16 bytes
  EXPECT_REJECTED(c, "q", "head_dim (shape[2]) must be a multiple of 8 from 8 to 512", "got 100");
  c = make_call();
  c.v.shape[0] = 499;
  EXPECT_REJECTED(c, "v", "expected shape (500, 2, 128)", "got (499, 2, 128)");
  c = make_call();
  c.lse->shape[1] = 301;
  EXPECT_REJECTED(c, "lse", "expected shape (heads_q, total_q) = (8, 300)", "got (8, 301)");
  c = make_call();
  c.k.stride[2] = 2;
  EXPECT_REJECTED(c, "k", "last dimension (head_dim) must be contiguous (stride[2] == 1)");
  c = make_call();
  c.out.stride[0] = 8 * 128 + 4;
  EXPECT_REJECTED(c, "out", "stride[0] (total)", "multiple of 16 bytes");
  c = make_call();
  c.k.dtype = DType::f16, c.v.dtype = DType::f16;
  EXPECT_REJECTED(c, "k", "expected dtype bfloat16 (same as q)", "got float16");
}

TEST(varlen_offset_rules) {
  Call c = make_call();
  c.batch.cu_seqlens_q.dtype = DType::f32;
  EXPECT_REJECTED(c, "cu_seqlens_q", "expected dtype int32", "got float32");
  c = make_call();
  c.batch.cu_seqlens_k.rank = 2;
  EXPECT_REJECTED(c, "cu_seqlens_k", "expected rank 1 (batch + 1)");
  c = make_call();
  c.batch.cu_seqlens_k.shape[0] = 3;
  EXPECT_REJECTED(c, "cu_seqlens_k", "expected 4 entries (batch + 1, as cu_seqlens_q), got 3");
  c = make_call();
  c.batch.cu_seqlens_q.shape[0] = 0;
  EXPECT_REJECTED(c, "cu_seqlens_q", "batch + 1 >= 1 entries");
  c = make_call();
  c.batch.seqused_k->shape[0] = 4;
  EXPECT_REJECTED(c, "seqused_k", "expected 3 entries (batch, one per sequence of cu_seqlens_q), got 4");
  c = make_call();
  c.batch.cu_seqlens_q.stride[0] = 2;
  EXPECT_REJECTED(c, "cu_seqlens_q", "must be contiguous (stride[0] == 1)");
  c = make_call();
  c.batch.cu_seqlens_q.data = nullptr;
  EXPECT_REJECTED(c, "cu_seqlens_q", "data is null");
  c = make_call();
  c.batch.cu_seqlens_k.data = fake(0x70000002);
  EXPECT_REJECTED(c, "cu_seqlens_k", "4-byte aligned");
  c = make_call();
  c.batch.max_seqlen_k = -1;
  EXPECT_REJECTED(c, "max_seqlen_k", "expected >= 0, got -1");
  c = make_call();
  c.batch.cu_seqlens_k.data = fake(0x40000000 + 64);  // inside out
  EXPECT_REJECTED(c, "out", "must not overlap cu_seqlens_k");
  c = make_call();
  c.batch.seqused_k->data = fake(0x50000000);  // lse's first bytes
  EXPECT_REJECTED(c, "lse", "must not overlap seqused_k");
  // The plan's table: heads x (total_q / 128 + batch) tiles within 2^31.
  c = make_call(int64_t(1) << 30, 500, 3);
  c.lse.reset();
  const int64_t q_shape[3] = {int64_t(1) << 30, 512, 128};
  c.q = warpattn::make_contiguous_view(fake(0x10000000), DType::bf16, 3, q_shape);
  c.out = warpattn::make_contiguous_view(fake(0x40000000), DType::bf16, 3, q_shape);
  EXPECT_REJECTED(c, "cu_seqlens_q", "work tiles must be less than 2^31");
}

// ---- backward_varlen
namespace {

struct BackwardCall {
  Call f;  // q, k, v, out, lse, batch as the forward's
  TensorView dout, dq, dk, dv;
  warpattn::BackwardOptions options;
};

BackwardCall make_backward_call() {
  BackwardCall c;
  c.f = make_call();
  const int64_t q_shape[3] = {300, 8, 128}, kv_shape[3] = {500, 2, 128};
  c.dout = warpattn::make_contiguous_view(fake(0x90000000), DType::bf16, 3, q_shape);
  c.dq = warpattn::make_contiguous_view(fake(0xa0000000), DType::bf16, 3, q_shape);
  c.dk = warpattn::make_contiguous_view(fake(0xb0000000), DType::bf16, 3, kv_shape);
  c.dv = warpattn::make_contiguous_view(fake(0xc0000000), DType::bf16, 3, kv_shape);
  return c;
}

std::optional<std::string> backward_error_of(const BackwardCall& c, const std::optional<warpattn::Workspace>& w = {}) {
  try {
    warpattn::validate_backward_varlen(c.dout, c.f.q, c.f.k, c.f.v, c.f.out, *c.f.lse, c.dq, c.dk, c.dv, c.f.batch,
                                       c.options, w);
  } catch (const warpattn::Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

void expect_backward_rejected(const BackwardCall& c, const std::string& argument, const char* text, int line,
                              const std::optional<warpattn::Workspace>& w = {}) {
  const auto m = backward_error_of(c, w);
  if (!m) {
    CHECK(false) << "line " << line << ": accepted, expected an error about " << argument;
    return;
  }
  CHECK(m->rfind(argument + ": ", 0) == 0) << "line " << line << ": should name " << argument << ": " << *m;
  CHECK(m->find(text) != std::string::npos) << "line " << line << ": missing \"" << text << "\" in: " << *m;
}

}  // namespace

TEST(varlen_backward_rules) {
  BackwardCall c = make_backward_call();
  CHECK(!backward_error_of(c)) << *backward_error_of(c);
  c.dq.rank = 4;
  expect_backward_rejected(c, "dq", "expected rank 3 (total, heads, head_dim)", __LINE__);
  c = make_backward_call();
  c.dk.shape[0] = 499;
  expect_backward_rejected(c, "dk", "expected shape (500, 2, 128)", __LINE__);
  c = make_backward_call();
  c.f.batch.cu_seqlens_k.dtype = DType::s8;
  expect_backward_rejected(c, "cu_seqlens_k", "expected dtype int32", __LINE__);
  c = make_backward_call();
  c.f.batch.cu_seqlens_q.data = fake(0xa0000000 + 128);  // inside dq
  expect_backward_rejected(c, "dq", "must not overlap cu_seqlens_q", __LINE__);
  // The workspace: the padded layout's size (each sequence's rows padded to whole granules: 128
  // rows, 320 at d = 128, whose kernel walks 80-row blocks without a mask).
  c = make_backward_call();
  const size_t needed = warpattn::backward_varlen_workspace_bytes(c.f.q, 3, c.options);
  // (300 + 3 x G) rows rounded up to G, x 8 heads x (128 + 2) floats: 768 rows at G = 128, 1280 at 320
  const int64_t g = warpattn::detail::backward_row_granule(128);
  const size_t rows = size_t((300 + 3 * g + g - 1) / g * g);
  CHECK(needed >= rows * 8 * 130 * 4 && needed < rows * 8 * 130 * 4 + 4096) << needed;
  expect_backward_rejected(c, "workspace", "expected at least", __LINE__,
                           warpattn::Workspace{fake(0xd0000000), needed - 1});
  CHECK(!backward_error_of(c, warpattn::Workspace{fake(0xd0000000), needed}));
  try {
    warpattn::backward_varlen_workspace_bytes(c.f.q, -1, c.options);
    CHECK(false) << "a negative batch was accepted";
  } catch (const warpattn::Error& e) {
    CHECK(std::string(e.what()).rfind("batch: ", 0) == 0) << e.what();
  }
}

// ---- head dims: any multiple of 8 from 8 to 512, packed as dense (the same kernels, padded)
namespace {
// t, a contiguous (total, heads, head_dim) view, at head dim d.
void set_head_dim(TensorView& t, int64_t d) {
  t.shape[2] = d, t.stride[1] = d, t.stride[0] = t.shape[1] * d;
}
}  // namespace

TEST(varlen_padded_head_dims) {
  for (int64_t d : {8, 40, 80, 96, 200, 248, 264, 384, 512}) {
    Call c = make_call();
    for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) set_head_dim(*t, d);
    CHECK(!error_of(c)) << "d=" << d << ": " << *error_of(c);
    BackwardCall b = make_backward_call();
    for (TensorView* t : {&b.f.q, &b.f.k, &b.f.v, &b.f.out, &b.dout, &b.dq, &b.dk, &b.dv}) set_head_dim(*t, d);
    CHECK(!backward_error_of(b)) << "d=" << d << ": " << *backward_error_of(b);
  }
  for (int64_t d : {100, 4, 520}) {
    Call c = make_call();
    for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) set_head_dim(*t, d);
    // 100 and 4 leave rows of 200 and 8 bytes: the head dim rule must come first regardless
    const std::string got = "got " + std::to_string(d);
    EXPECT_REJECTED(c, "q", "head_dim (shape[2]) must be a multiple of 8 from 8 to 512", got.c_str());
  }
  for (int64_t d : {100, 4, 520}) {
    // the backward goes to 512 as the forward does (above 256 in the 512 kernel)
    BackwardCall b = make_backward_call();
    for (TensorView* t : {&b.f.q, &b.f.k, &b.f.v, &b.f.out, &b.dout, &b.dq, &b.dk, &b.dv}) set_head_dim(*t, d);
    expect_backward_rejected(b, "q", "must be a multiple of 8 from 8 to 512", __LINE__);
  }
  // The backward's softcap at every head dim (at 8 to 64 in the 128 kernel).
  for (int64_t d : {32, 64, 80}) {
    BackwardCall b = make_backward_call();
    for (TensorView* t : {&b.f.q, &b.f.k, &b.f.v, &b.f.out, &b.dout, &b.dq, &b.dk, &b.dv}) set_head_dim(*t, d);
    b.options.softcap = 30.f;
    CHECK(!backward_error_of(b)) << "d=" << d << ": " << *backward_error_of(b);
  }
}

// ---- the C ABI entries: the same rules, as status codes and messages
#include "warpattn/warpattn_c.h"

namespace {
warpattn_tensor c_tensor(const TensorView& t) {
  warpattn_tensor c{};
  c.data = t.data, c.dtype = static_cast<int>(t.dtype), c.rank = t.rank;
  for (int i = 0; i < t.rank; ++i) c.shape[i] = t.shape[i], c.stride[i] = t.stride[i];
  return c;
}
}  // namespace

TEST(c_varlen_entries_report_invalid_arguments) {
  Call c = make_call();
  c.batch.cu_seqlens_k.shape[0] = 3;
  const warpattn_tensor q = c_tensor(c.q), k = c_tensor(c.k), v = c_tensor(c.v), out = c_tensor(c.out),
                        lse = c_tensor(*c.lse), cq = c_tensor(c.batch.cu_seqlens_q), ck = c_tensor(c.batch.cu_seqlens_k);
  char err[256];
  int rc = warpattn_forward_varlen(&q, &k, &v, &out, &lse, &cq, &ck, nullptr, 200, 300, 0, 0.f, 1, nullptr, err,
                                   sizeof err);
  CHECK(rc == WARPATTN_INVALID) << rc;
  CHECK(std::string(err).rfind("cu_seqlens_k: expected 4 entries", 0) == 0) << err;
  BackwardCall b = make_backward_call();
  b.f.batch.cu_seqlens_q.dtype = DType::f32;
  const warpattn_tensor dout = c_tensor(b.dout), dq = c_tensor(b.dq), dk = c_tensor(b.dk), dv = c_tensor(b.dv),
                        bq = c_tensor(b.f.q), bk = c_tensor(b.f.k), bv = c_tensor(b.f.v), bo = c_tensor(b.f.out),
                        bl = c_tensor(*b.f.lse), bcq = c_tensor(b.f.batch.cu_seqlens_q),
                        bck = c_tensor(b.f.batch.cu_seqlens_k);
  rc = warpattn_backward_varlen(&dout, &bq, &bk, &bv, &bo, &bl, &dq, &dk, &dv, &bcq, &bck, nullptr, 0, 0, 0, 0.f, 0, 0,
                                nullptr, 0, nullptr, err, sizeof err);
  CHECK(rc == WARPATTN_INVALID) << rc;
  CHECK(std::string(err).rfind("cu_seqlens_q: expected dtype int32, got float32", 0) == 0) << err;
  size_t bytes = 0;
  rc = warpattn_backward_varlen_workspace_bytes(&bq, 3, 0, 0, &bytes, err, sizeof err);
  CHECK(rc == WARPATTN_OK && bytes == warpattn::backward_varlen_workspace_bytes(b.f.q, 3, {})) << err;
}

// ---- FP8 on packed batches
#include "warpattn/fp8.hpp"

TEST(varlen_fp8_rules) {
  Call c = make_call();  // 3 sequences, total_q 300, total_k 500, Hq 8, Hkv 2, D 128
  const int64_t rows_q = warpattn::fp8_varlen_rows(300, 3), rows_k = warpattn::fp8_varlen_rows(500, 3);
  CHECK(rows_q == 768 && rows_k == 896) << rows_q << " " << rows_k;
  const int64_t q_shape[3] = {300, 8, 128}, k_shape[3] = {500, 2, 128}, vt_shape[3] = {2, 128, rows_k},
                qs_shape[2] = {8, rows_q / 128}, ks_shape[2] = {2, rows_k / 128};
  warpattn::Fp8Operands f;
  f.q = warpattn::make_contiguous_view(fake(0x90000000), DType::e4m3, 3, q_shape);
  f.k = warpattn::make_contiguous_view(fake(0xa0000000), DType::e4m3, 3, k_shape);
  f.vt = warpattn::make_contiguous_view(fake(0xb0000000), DType::e4m3, 3, vt_shape);
  f.q_descale = warpattn::make_contiguous_view(fake(0xc0000000), DType::f32, 2, qs_shape);
  f.k_descale = warpattn::make_contiguous_view(fake(0xc1000000), DType::f32, 2, ks_shape);
  f.v_descale = warpattn::make_contiguous_view(fake(0xc2000000), DType::f32, 2, ks_shape);
  const auto quantize_error = [&](const warpattn::Fp8Operands& ops) -> std::string {
    try {
      warpattn::validate_quantize_fp8_varlen(c.q, c.k, c.v, ops, c.batch, {});
    } catch (const warpattn::Error& e) {
      return e.what();
    }
    return "";
  };
  const auto forward_error = [&](const warpattn::Fp8Operands& ops) -> std::string {
    try {
      warpattn::validate_forward_fp8_varlen(ops, c.out, c.lse, c.batch, {});
    } catch (const warpattn::Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(quantize_error(f).empty()) << quantize_error(f);
  CHECK(forward_error(f).empty()) << forward_error(f);
  warpattn::Fp8Operands bad = f;
  bad.vt.shape[2] = rows_k - 128, bad.vt.stride[1] = rows_k - 128, bad.vt.stride[0] = 128 * (rows_k - 128);
  CHECK(forward_error(bad).rfind("vt: expected shape (2, 128, 896) (heads_kv, head_dim, fp8_varlen_rows(total_k, batch))", 0) == 0)
      << forward_error(bad);
  bad = f;
  bad.q_descale.rank = 3;
  CHECK(quantize_error(bad).rfind("fp8.q_descale: expected rank 2 (heads, blocks)", 0) == 0) << quantize_error(bad);
  bad = f;
  bad.k_descale.data = fake(0x60000000);  // cu_seqlens_q's address: written by quantize
  CHECK(quantize_error(bad).rfind("fp8.k_descale: must not overlap cu_seqlens_q", 0) == 0) << quantize_error(bad);
}

// The batch-invariant backward is the deterministic one: it needs the deterministic mode's
// workspace (its turn counters).
TEST(batch_invariant_backward_is_deterministic) {
  Call c = make_call();
  warpattn::BackwardOptions plain, det, inv;
  det.deterministic = true;
  inv.batch_invariant = true;
  const size_t a = warpattn::backward_varlen_workspace_bytes(c.q, 3, plain),
               b = warpattn::backward_varlen_workspace_bytes(c.q, 3, det),
               d = warpattn::backward_varlen_workspace_bytes(c.q, 3, inv);
  CHECK(b > a && d == b) << a << " " << b << " " << d;
  const int64_t q4[4] = {2, 300, 8, 128};
  const TensorView dense_q = warpattn::make_contiguous_view(fake(0x10000000), DType::bf16, 4, q4);
  CHECK(warpattn::backward_workspace_bytes(dense_q, inv) == warpattn::backward_workspace_bytes(dense_q, det));
}
