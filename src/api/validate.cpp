// Argument validation for warpattn::forward, and the check for a Hopper device.
//
// Every rule runs on the host before anything is launched or written, in a fixed order (the
// rule letters below), so that a call with several mistakes always reports the same, most
// basic one first: a rank mistake makes every later shape message meaningless, a null pointer
// or wrong dtype makes a stride message beside the point, and so on. Each message names the
// argument, says what was expected and what came.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "api/message.hpp"
#include "api/problem.hpp"

namespace warpattn::detail {
// Any zero-sized dimension makes a tensor empty. Decided without multiplying the sizes, which
// could overflow for the absurd shapes validation exists to reject.
bool is_empty(const TensorView& t) {
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return true;
  return false;
}

namespace {

// The Tensor Memory Accelerator's rules for a global tensor: 16-byte aligned base, strides
// (other than the innermost) multiples of 16 bytes and below 2^40 bytes.
constexpr int64_t kTmaAlignBytes = 16;
constexpr int64_t kTmaStrideLimitBytes = int64_t(1) << 40;
// The kernel indexes rows, heads and batches with 32-bit coordinates.
constexpr int64_t kCoordinateLimit = int64_t(1) << 31;

const char* const kAttentionDimNames[4] = {"batch", "seqlen", "heads", "head_dim"};
const char* const kLseDimNames[3] = {"batch", "heads", "seqlen_q"};

// One argument under check: its name for messages and which dimension names apply.
struct Arg {
  const char* name;
  const TensorView& view;
  const char* const* dim_names;
  int expected_rank;
};

[[noreturn]] void fail(const Message& message) { throw Error(message.str()); }

std::string shape_string(const TensorView& t) {
  Message s;
  s << "(";
  for (int i = 0; i < t.rank; ++i) s << (i ? ", " : "") << t.shape[i];
  s << ")";
  return s.str();
}


// ---- a. rank
void check_rank(const Arg& a) {
  if (a.view.rank == a.expected_rank) return;
  Message m;
  m << a.name << ": expected rank " << a.expected_rank << " (";
  for (int i = 0; i < a.expected_rank; ++i) m << (i ? ", " : "") << a.dim_names[i];
  m << "), got rank " << a.view.rank;
  fail(m);
}

// ---- b. negative sizes
void check_sizes_not_negative(const Arg& a) {
  for (int i = 0; i < a.view.rank; ++i) {
    if (a.view.shape[i] >= 0) continue;
    Message m;
    m << a.name << ": shape[" << i << "] (" << a.dim_names[i] << ") must not be negative, got "
      << a.view.shape[i];
    fail(m);
  }
}

// ---- c. null data: allowed only where there is nothing to read or write
void check_not_null(const Arg& a) {
  if (a.view.data != nullptr || is_empty(a.view)) return;
  Message m;
  m << a.name << ": data is null, expected a device pointer for a non-empty tensor of shape "
    << shape_string(a.view);
  fail(m);
}

// ---- h. innermost dimension contiguous (the TMA box and the kernel's vector accesses need it)
void check_last_dim_contiguous(const Arg& a) {
  const int last = a.view.rank - 1;
  if (a.view.stride[last] == 1) return;
  Message m;
  m << a.name << ": last dimension (" << a.dim_names[last] << ") must be contiguous (stride["
    << last << "] == 1), got stride[" << last << "] = " << a.view.stride[last];
  fail(m);
}

// ---- i. alignment and strides. Empty tensors are never accessed, so nothing is required.
// `base_align` is the required pointer alignment; for q, k, v and out (read and written through
// the TMA) the outer strides also follow the TMA rules, while lse and the descales, accessed with
// plain fp32 loads and stores, need only 4-byte alignment and no stride rule beyond the sign
// ones below. `sign_dims`: how many leading dimensions' strides must be positive (the rest are
// checked elsewhere: a TMA tensor's last stride is 1 by rule h, a descale array's blocks stride
// by check_descale_block_stride).
void check_alignment_and_strides(const Arg& a, int64_t base_align, bool tma_strides, int sign_dims) {
  const TensorView& t = a.view;
  if (is_empty(t)) return;
  const auto address = reinterpret_cast<uintptr_t>(t.data);
  if (address % static_cast<uintptr_t>(base_align) != 0) {
    Message m;
    m << a.name << ": data pointer " << hex(address) << " must be " << base_align << "-byte aligned"
      << (tma_strides ? " (TMA)" : "");
    fail(m);
  }
  const int64_t elem = dtype_size(t.dtype);
  for (int i = 0; i < sign_dims; ++i) {
    const int64_t s = t.stride[i];
    if (s < 0) {
      Message m;
      m << a.name << ": stride[" << i << "] (" << a.dim_names[i] << ") must not be negative, got "
        << s;
      fail(m);
    }
    // A zero stride over a dimension of size > 1 makes different rows alias one another: a
    // write race for out and lse, and for inputs a broadcast the API does not promise. One rule
    // for every tensor keeps it simple; a size-1 dimension is never stepped over, so any
    // stride is fine there.
    if (s == 0 && t.shape[i] > 1) {
      Message m;
      m << a.name << ": stride[" << i << "] (" << a.dim_names[i]
        << ") must be positive for a dimension of size " << t.shape[i] << ", got 0";
      fail(m);
    }
  }
  if (!tma_strides) return;
  for (int i = 0; i < t.rank - 1; ++i) {
    const int64_t s = t.stride[i];
    // Compared in elements so that a huge stride cannot overflow the byte count.
    if (s >= kTmaStrideLimitBytes / elem) {
      Message m;
      m << a.name << ": stride[" << i << "] (" << a.dim_names[i] << ") = " << s
        << " elements must be less than 2^40 bytes (TMA)";
      fail(m);
    }
    if ((s * elem) % kTmaAlignBytes != 0) {
      Message m;
      m << a.name << ": stride[" << i << "] (" << a.dim_names[i] << ") = " << s
        << " elements = " << s * elem << " bytes must be a multiple of 16 bytes (TMA)";
      fail(m);
    }
  }
}

// The sign rules of check_alignment_and_strides for a tensor read or written through the TMA
// (its last stride is 1 by rule h), and for one accessed with plain fp32 loads and stores.
void check_tma_layout(const Arg& a) { check_alignment_and_strides(a, kTmaAlignBytes, true, a.view.rank - 1); }
void check_fp32_layout(const Arg& a, int sign_dims) {
  check_alignment_and_strides(a, dtype_size(DType::f32), false, sign_dims);
}

// ---- j. batch, sequence and head counts within the kernel's 32-bit coordinates
void check_coordinates_fit(const Arg& a) {
  for (int i = 0; i < a.view.rank; ++i) {
    if (a.view.shape[i] < kCoordinateLimit) continue;
    Message m;
    m << a.name << ": " << a.dim_names[i] << " (shape[" << i << "]) = " << a.view.shape[i]
      << " must be less than 2^31 (the kernel uses 32-bit coordinates)";
    fail(m);
  }
}

// ---- l. overlap: the inclusive byte range [first, last] a view can touch, from its shape and
// strides (all non-negative by now: rules b, h and i ran first). The arithmetic saturates at
// 2^64 - 1: a view that reaches that far cannot exist, and treating it as reaching the top of
// the address space keeps the overlap test conservative rather than wrapped around.
struct ByteRange {
  uint64_t first;
  uint64_t last;
};

uint64_t saturating_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

uint64_t saturating_mul(uint64_t a, uint64_t b) {
  return (a != 0 && b > UINT64_MAX / a) ? UINT64_MAX : a * b;
}

ByteRange byte_range(const TensorView& t) {
  const uint64_t elem = static_cast<uint64_t>(dtype_size(t.dtype));
  uint64_t span = 0;  // offset of the farthest element, in elements
  for (int i = 0; i < t.rank; ++i) {
    const uint64_t reach =
        saturating_mul(static_cast<uint64_t>(t.stride[i]), static_cast<uint64_t>(t.shape[i] - 1));
    span = saturating_add(span, reach);
  }
  const uint64_t first = reinterpret_cast<uintptr_t>(t.data);
  const uint64_t last = saturating_add(first, saturating_add(saturating_mul(span, elem), elem - 1));
  return {first, last};
}

void check_no_overlap(const Arg& written, const Arg& other) {
  if (is_empty(written.view) || is_empty(other.view)) return;
  const ByteRange w = byte_range(written.view);
  const ByteRange o = byte_range(other.view);
  if (w.last < o.first || o.last < w.first) return;
  Message m;
  m << written.name << ": must not overlap " << other.name << " in memory, but " << written.name
    << " spans bytes [" << hex(w.first) << ", " << hex(w.last) << "] and " << other.name
    << " spans [" << hex(o.first) << ", " << hex(o.last) << "]";
  fail(m);
}

// ---- m. a written tensor must give each element its own address, or threads writing
// different elements race. Sufficient rule (the one PyTorch calls "non-overlapping"): taken in
// increasing order of stride, each dimension of size > 1 must step past every element the
// dimensions with smaller strides reach. Strides are positive here (rule i ran first).
void check_no_self_overlap(const Arg& a) {
  const TensorView& t = a.view;
  if (is_empty(t)) return;
  int order[4];
  int n = 0;
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1) order[n++] = i;
  for (int x = 1; x < n; ++x)  // insertion sort by stride, at most 4 entries
    for (int y = x; y > 0 && t.stride[order[y]] < t.stride[order[y - 1]]; --y) std::swap(order[y], order[y - 1]);
  uint64_t reach = 0;  // offset, in elements, of the farthest element of the dimensions so far
  for (int x = 0; x < n; ++x) {
    const int i = order[x];
    const auto s = static_cast<uint64_t>(t.stride[i]);
    if (s <= reach) {
      Message m;
      m << a.name << ": stride[" << i << "] (" << a.dim_names[i] << ") = " << t.stride[i]
        << " makes distinct elements share memory: the dimensions with smaller strides already reach " << reach
        << " elements past an element's start (a written tensor needs each stride, in increasing order, "
           "to step past them)";
      fail(m);
    }
    reach = saturating_add(reach, saturating_mul(s, static_cast<uint64_t>(t.shape[i] - 1)));
  }
}

// ---- k. softmax scale: positive, because the kernel tracks each row's maximum score and
// folds the scale into the exponent (a negative scale would turn that max into a min).
void check_softmax_scale(const ForwardOptions& options) {
  if (!options.softmax_scale) return;
  const float s = *options.softmax_scale;
  if (std::isfinite(s) && s > 0.f) return;
  Message m;
  m << "softmax_scale: expected a finite positive value, got " << s;
  fail(m);
}

// What dispatch needs of a validated call; the softmax scale resolved to its default.
ForwardProblem forward_problem(const ProblemSizes& sizes, DType dtype, const ForwardOptions& options, bool has_lse) {
  ForwardProblem p;
  p.batch = sizes.batch;
  p.seqlen_q = sizes.seqlen_q;
  p.seqlen_k = sizes.seqlen_k;
  p.heads_q = sizes.heads_q;
  p.heads_kv = sizes.heads_kv;
  p.head_dim = sizes.head_dim;
  p.dtype = dtype;
  p.softmax_scale = options.softmax_scale
                        ? *options.softmax_scale
                        : static_cast<float>(1.0 / std::sqrt(static_cast<double>(sizes.head_dim)));
  p.causal = options.causal;
  p.has_lse = has_lse;
  return p;
}

std::string supported_head_dims() {
  Message s;
  bool first = true;
  for (int d : kSupportedHeadDims) {
    s << (first ? "" : ", ") << d;
    first = false;
  }
  return s.str();
}

bool is_supported_head_dim(int64_t d) {
  for (int s : kSupportedHeadDims)
    if (d == s) return true;
  return false;
}

}  // namespace

ForwardProblem validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const std::optional<TensorView>& lse,
                                const ForwardOptions& options) {
  const Arg aq{"q", q, kAttentionDimNames, 4};
  const Arg ak{"k", k, kAttentionDimNames, 4};
  const Arg av{"v", v, kAttentionDimNames, 4};
  const Arg aout{"out", out, kAttentionDimNames, 4};
  const Arg* const attention_args[4] = {&aq, &ak, &av, &aout};
  const TensorView no_lse;
  const Arg alse{"lse", lse ? *lse : no_lse, kLseDimNames, 3};

  // a. rank
  for (const Arg* a : attention_args) check_rank(*a);
  if (lse) check_rank(alse);

  // b. negative sizes
  for (const Arg* a : attention_args) check_sizes_not_negative(*a);
  if (lse) check_sizes_not_negative(alse);

  // c. null pointers
  for (const Arg* a : attention_args) check_not_null(*a);
  if (lse) check_not_null(alse);

  // d. dtypes
  if (q.dtype != DType::f16 && q.dtype != DType::bf16) {
    Message m;
    m << "q: expected dtype float16 or bfloat16, got " << dtype_name(q.dtype);
    fail(m);
  }
  for (const Arg* a : {&ak, &av, &aout}) {
    if (a->view.dtype == q.dtype) continue;
    Message m;
    m << a->name << ": expected dtype " << dtype_name(q.dtype) << " (same as q), got "
      << dtype_name(a->view.dtype);
    fail(m);
  }
  if (lse && lse->dtype != DType::f32) {
    Message m;
    m << "lse: expected dtype float32, got " << dtype_name(lse->dtype);
    fail(m);
  }

  // e. head dimension
  const int64_t head_dim = q.shape[3];
  if (!is_supported_head_dim(head_dim)) {
    Message m;
    m << "q: head_dim (shape[3]) must be one of " << supported_head_dims() << ", got " << head_dim;
    fail(m);
  }
  for (const Arg* a : {&ak, &av, &aout}) {
    if (a->view.shape[3] == head_dim) continue;
    Message m;
    m << a->name << ": expected head_dim " << head_dim << " (same as q), got " << a->view.shape[3];
    fail(m);
  }

  // f. batch and shape agreement
  const int64_t batch = q.shape[0];
  for (const Arg* a : {&ak, &av, &aout}) {
    if (a->view.shape[0] == batch) continue;
    Message m;
    m << a->name << ": expected batch " << batch << " (same as q), got " << a->view.shape[0];
    fail(m);
  }
  if (v.shape[1] != k.shape[1] || v.shape[2] != k.shape[2]) {
    Message m;
    m << "v: expected shape " << shape_string(k) << " (same as k), got " << shape_string(v);
    fail(m);
  }
  if (out.shape[1] != q.shape[1] || out.shape[2] != q.shape[2]) {
    Message m;
    m << "out: expected shape " << shape_string(q) << " (same as q), got " << shape_string(out);
    fail(m);
  }
  if (lse &&
      (lse->shape[0] != batch || lse->shape[1] != q.shape[2] || lse->shape[2] != q.shape[1])) {
    Message m;
    m << "lse: expected shape (batch, heads_q, seqlen_q) = (" << batch << ", " << q.shape[2] << ", "
      << q.shape[1] << "), got " << shape_string(*lse);
    fail(m);
  }

  // g. grouped-query heads: every query head maps onto one key/value head
  const int64_t heads_q = q.shape[2];
  const int64_t heads_kv = k.shape[2];
  if (heads_q >= 1 && heads_kv < 1) {
    Message m;
    m << "k: expected at least 1 key/value head for " << heads_q << " query heads, got "
      << heads_kv;
    fail(m);
  }
  if (heads_kv >= 1 && heads_q % heads_kv != 0) {
    Message m;
    m << "k: query heads (" << heads_q << ") must be a multiple of key/value heads (" << heads_kv
      << ")";
    fail(m);
  }

  // h. innermost dimension contiguous
  for (const Arg* a : attention_args) check_last_dim_contiguous(*a);
  // lse is written from registers, not by TMA: any positive strides will do.

  // i. alignment and strides
  for (const Arg* a : attention_args) check_tma_layout(*a);
  if (lse) check_fp32_layout(alse, 3);

  // j. 32-bit coordinates (v matches k, out and lse match q, so q and k cover every size)
  check_coordinates_fit(aq);
  check_coordinates_fit(ak);

  // k. softmax scale
  check_softmax_scale(options);

  // l. outputs must not alias anything else the call reads or writes
  for (const Arg* a : {&aq, &ak, &av}) check_no_overlap(aout, *a);
  if (lse) {
    check_no_overlap(aout, alse);
    for (const Arg* a : {&aq, &ak, &av}) check_no_overlap(alse, *a);
  }

  // m. each written element at its own address
  check_no_self_overlap(aout);
  if (lse) check_no_self_overlap(alse);

  return forward_problem({batch, q.shape[1], k.shape[1], heads_q, heads_kv, head_dim}, q.dtype, options,
                         lse.has_value());
}

// ---- FP8 (warpattn/fp8.hpp). The same rule letters, in the same order.
namespace {

const char* const kVtDimNames[4] = {"batch", "heads", "head_dim", "keys"};
const char* const kDescaleDimNames[3] = {"batch", "heads", "blocks"};

void check_dtype(const Arg& a, DType want) {
  if (a.view.dtype == want) return;
  Message m;
  m << a.name << ": expected dtype " << dtype_name(want) << ", got " << dtype_name(a.view.dtype);
  fail(m);
}

void check_shape(const Arg& a, const int64_t* want, const char* why) {
  bool same = true;
  for (int i = 0; i < a.expected_rank; ++i) same = same && a.view.shape[i] == want[i];
  if (same) return;
  Message m;
  m << a.name << ": expected shape (";
  for (int i = 0; i < a.expected_rank; ++i) m << (i ? ", " : "") << want[i];
  m << ") " << why << ", got " << shape_string(a.view);
  fail(m);
}

int64_t blocks_of(int64_t rows) { return (rows + kFp8BlockRows - 1) / kFp8BlockRows; }

// The blocks dimension of a descale array (its last, which check_alignment_and_strides leaves
// alone): never negative; 0 broadcasts one descale per (batch, head) over the blocks, as
// FlashAttention-3 takes them, which only an array that is read may do.
void check_descale_block_stride(const Arg& a, bool written) {
  const int64_t s = a.view.stride[2];
  if (s > 0 || a.view.shape[2] <= 1 || (s == 0 && !written)) return;
  Message m;
  m << a.name << ": stride[2] (blocks) must be " << (written ? "positive" : "zero or positive") << ", got " << s;
  fail(m);
}

}  // namespace

ProblemSizes validate_fp8_operands(const Fp8Operands& f) {
  const Arg aq{"q", f.q, kAttentionDimNames, 4}, ak{"k", f.k, kAttentionDimNames, 4},
      avt{"vt", f.vt, kVtDimNames, 4}, aqs{"q_descale", f.q_descale, kDescaleDimNames, 3},
      aks{"k_descale", f.k_descale, kDescaleDimNames, 3}, avs{"v_descale", f.v_descale, kDescaleDimNames, 3};
  const Arg* const tensors[3] = {&aq, &ak, &avt};
  const Arg* const scales[3] = {&aqs, &aks, &avs};
  for (const Arg* a : tensors) check_rank(*a);
  for (const Arg* a : scales) check_rank(*a);
  for (const Arg* a : tensors) check_sizes_not_negative(*a);
  for (const Arg* a : scales) check_sizes_not_negative(*a);
  for (const Arg* a : tensors) check_not_null(*a);
  for (const Arg* a : scales) check_not_null(*a);
  // Q and K: e4m3, or both INT8 (the S GEMM in s8); Vᵀ is e4m3 either way.
  if (f.q.dtype != DType::e4m3 && f.q.dtype != DType::s8) {
    Message m;
    m << "q: expected dtype float8_e4m3fn or int8, got " << dtype_name(f.q.dtype);
    fail(m);
  }
  check_dtype(ak, f.q.dtype);
  check_dtype(avt, DType::e4m3);
  for (const Arg* a : scales) check_dtype(*a, DType::f32);
  const int64_t head_dim = f.q.shape[3];
  bool supported = false;
  for (int d : kFp8HeadDims) supported = supported || d == head_dim;
  if (!supported) {
    Message m;
    m << "q: head_dim (shape[3]) must be one of ";
    bool first = true;
    for (int d : kFp8HeadDims) {
      m << (first ? "" : ", ") << d;
      first = false;
    }
    m << " for FP8, got " << head_dim;
    fail(m);
  }
  ProblemSizes p;
  p.batch = f.q.shape[0];
  p.seqlen_q = f.q.shape[1];
  p.heads_q = f.q.shape[2];
  p.head_dim = head_dim;
  p.seqlen_k = f.k.shape[1];
  p.heads_kv = f.k.shape[2];
  const int64_t k_want[4] = {p.batch, p.seqlen_k, p.heads_kv, head_dim};
  check_shape(ak, k_want, "(batch and head_dim as q)");
  const int64_t vt_want[4] = {p.batch, p.heads_kv, head_dim, fp8_padded_keys(p.seqlen_k)};
  check_shape(avt, vt_want, "(batch, heads_kv, head_dim, seqlen_k rounded up to 16)");
  const int64_t qs_want[3] = {p.batch, p.heads_q, blocks_of(p.seqlen_q)};
  check_shape(aqs, qs_want, "(batch, heads_q, ceil(seqlen_q / 128))");
  const int64_t kvs_want[3] = {p.batch, p.heads_kv, blocks_of(p.seqlen_k)};
  check_shape(aks, kvs_want, "(batch, heads_kv, ceil(seqlen_k / 128))");
  check_shape(avs, kvs_want, "(batch, heads_kv, ceil(seqlen_k / 128))");
  if (p.heads_q >= 1 && p.heads_kv < 1) {
    Message m;
    m << "k: expected at least 1 key/value head for " << p.heads_q << " query heads, got " << p.heads_kv;
    fail(m);
  }
  if (p.heads_kv >= 1 && p.heads_q % p.heads_kv != 0) {
    Message m;
    m << "k: query heads (" << p.heads_q << ") must be a multiple of key/value heads (" << p.heads_kv << ")";
    fail(m);
  }
  for (const Arg* a : tensors) check_last_dim_contiguous(*a);
  for (const Arg* a : tensors) check_tma_layout(*a);
  for (const Arg* a : scales) check_fp32_layout(*a, 2);
  for (const Arg* a : scales) check_descale_block_stride(*a, false);
  check_coordinates_fit(aq);
  check_coordinates_fit(ak);
  check_coordinates_fit(avt);
  return p;
}

ProblemSizes validate_quantize(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& f) {
  // The inputs first, by forward()'s rules (with q standing in for out, which is not written):
  // rank, sizes, null, dtype, head dim, shapes, GQA, layout.
  const Arg aq{"q", q, kAttentionDimNames, 4}, ak{"k", k, kAttentionDimNames, 4}, av{"v", v, kAttentionDimNames, 4};
  const Arg* const inputs[3] = {&aq, &ak, &av};
  for (const Arg* a : inputs) check_rank(*a);
  for (const Arg* a : inputs) check_sizes_not_negative(*a);
  for (const Arg* a : inputs) check_not_null(*a);
  if (q.dtype != DType::f16 && q.dtype != DType::bf16) {
    Message m;
    m << "q: expected dtype float16 or bfloat16, got " << dtype_name(q.dtype);
    fail(m);
  }
  for (const Arg* a : {&ak, &av}) check_dtype(*a, q.dtype);
  const ProblemSizes p = validate_fp8_operands(f);
  const Arg fq{"fp8.q", f.q, kAttentionDimNames, 4}, fk{"fp8.k", f.k, kAttentionDimNames, 4};
  check_shape(aq, f.q.shape, "(same as fp8.q)");
  check_shape(ak, f.k.shape, "(same as fp8.k)");
  check_shape(av, f.k.shape, "(same as fp8.k)");
  for (const Arg* a : inputs) check_last_dim_contiguous(*a);
  for (const Arg* a : inputs) check_tma_layout(*a);
  const Arg avt{"fp8.vt", f.vt, kVtDimNames, 4}, aqs{"fp8.q_descale", f.q_descale, kDescaleDimNames, 3},
      aks{"fp8.k_descale", f.k_descale, kDescaleDimNames, 3}, avs{"fp8.v_descale", f.v_descale, kDescaleDimNames, 3};
  for (const Arg* a : {&aqs, &aks, &avs}) check_descale_block_stride(*a, true);
  const Arg* const outputs[6] = {&fq, &fk, &avt, &aqs, &aks, &avs};
  for (int i = 0; i < 6; ++i) {
    for (const Arg* in : inputs) check_no_overlap(*outputs[i], *in);
    for (int j = i + 1; j < 6; ++j) check_no_overlap(*outputs[i], *outputs[j]);
  }
  for (const Arg* a : outputs) check_no_self_overlap(*a);
  return p;
}

ForwardProblem validate_forward_fp8(const Fp8Operands& f, const TensorView& out, const std::optional<TensorView>& lse,
                                    const ForwardOptions& options) {
  const ProblemSizes p = validate_fp8_operands(f);
  const Arg aout{"out", out, kAttentionDimNames, 4};
  const TensorView no_lse;
  const Arg alse{"lse", lse ? *lse : no_lse, kLseDimNames, 3};
  check_rank(aout);
  if (lse) check_rank(alse);
  check_sizes_not_negative(aout);
  if (lse) check_sizes_not_negative(alse);
  check_not_null(aout);
  if (lse) check_not_null(alse);
  if (out.dtype != DType::f16 && out.dtype != DType::bf16) {
    Message m;
    m << "out: expected dtype float16 or bfloat16, got " << dtype_name(out.dtype);
    fail(m);
  }
  if (lse) check_dtype(alse, DType::f32);
  check_shape(aout, f.q.shape, "(same as q)");
  if (lse) {
    const int64_t want[3] = {p.batch, p.heads_q, p.seqlen_q};
    check_shape(alse, want, "(batch, heads_q, seqlen_q)");
  }
  check_last_dim_contiguous(aout);
  check_tma_layout(aout);
  if (lse) check_fp32_layout(alse, 3);
  check_softmax_scale(options);
  const Arg aq{"q", f.q, kAttentionDimNames, 4}, ak{"k", f.k, kAttentionDimNames, 4},
      avt{"vt", f.vt, kVtDimNames, 4}, aqs{"q_descale", f.q_descale, kDescaleDimNames, 3},
      aks{"k_descale", f.k_descale, kDescaleDimNames, 3}, avs{"v_descale", f.v_descale, kDescaleDimNames, 3};
  const Arg* const read[6] = {&aq, &ak, &avt, &aqs, &aks, &avs};
  for (const Arg* a : read) check_no_overlap(aout, *a);
  if (lse) {
    check_no_overlap(aout, alse);
    for (const Arg* a : read) check_no_overlap(alse, *a);
  }
  check_no_self_overlap(aout);
  if (lse) check_no_self_overlap(alse);
  return forward_problem(p, out.dtype, options, lse.has_value());
}

}  // namespace warpattn::detail
