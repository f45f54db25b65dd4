// Argument validation for warpattn::forward and warpattn::backward (and FP8's, further down).
//
// Every rule runs on the host before anything is launched or written, in a fixed order (the
// rule letters below), so that a call with several mistakes always reports the same, most
// basic one first: a rank mistake makes every later shape message meaningless, a null pointer
// or wrong dtype makes a stride message beside the point, and so on. Each message names the
// argument, says what was expected and what came. The forward and the backward run the same
// rule functions over their own lists of tensors (check_attention_tensors, check_written_apart).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "api/message.hpp"
#include "api/problem.hpp"
#include "hopper/backward/backward_block_m.hpp"
#include "hopper/backward/launch_backward.hpp"

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
// The backward's workspace regions start 256-byte aligned (hopper/backward/workspace.hpp), for
// the bulk copies and reductions that move dQ's accumulator.
constexpr uint64_t kWorkspaceAlignBytes = 256;

const char* const kAttentionDimNames[4] = {"batch", "seqlen", "heads", "head_dim"};
const char* const kLseDimNames[3] = {"batch", "heads", "seqlen_q"};

// One argument under check: its name for messages and which dimension names apply.
// hidden_dims: leading dimensions of size 1 that the caller's tensor does not have (a packed
// batch's (total, heads, head_dim) tensors are checked as (1, total, heads, head_dim)):
// messages number dimensions as the caller's tensor does.
struct Arg {
  const char* name;
  const TensorView& view;
  const char* const* dim_names;
  int expected_rank;
  int hidden_dims = 0;
  int dim(int i) const { return i - hidden_dims; }  // the caller's index of view dimension i
};

[[noreturn]] void fail(const Message& message) { throw Error(message.str()); }

std::string shape_string(const TensorView& t, int hidden_dims = 0) {
  Message s;
  s << "(";
  for (int i = hidden_dims; i < t.rank; ++i) s << (i > hidden_dims ? ", " : "") << t.shape[i];
  s << ")";
  return s.str();
}
std::string shape_string(const Arg& a) { return shape_string(a.view, a.hidden_dims); }

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
    m << a.name << ": shape[" << a.dim(i) << "] (" << a.dim_names[i] << ") must not be negative, got "
      << a.view.shape[i];
    fail(m);
  }
}

// ---- c. null data: allowed only where there is nothing to read or write
void check_not_null(const Arg& a) {
  if (a.view.data != nullptr || is_empty(a.view)) return;
  Message m;
  m << a.name << ": data is null, expected a device pointer for a non-empty tensor of shape "
    << shape_string(a);
  fail(m);
}

// ---- d. dtypes. `same_as`: the argument whose dtype `want` is, for the message (or none).
void check_dtype(const Arg& a, DType want, const char* same_as = nullptr) {
  if (a.view.dtype == want) return;
  Message m;
  m << a.name << ": expected dtype " << dtype_name(want);
  if (same_as != nullptr) m << " (same as " << same_as << ")";
  m << ", got " << dtype_name(a.view.dtype);
  fail(m);
}

// The element types of the 16-bit kernels' operands and outputs.
void check_16bit_dtype(const Arg& a) {
  if (a.view.dtype == DType::f16 || a.view.dtype == DType::bf16) return;
  Message m;
  m << a.name << ": expected dtype float16 or bfloat16, got " << dtype_name(a.view.dtype);
  fail(m);
}

// ---- e. head dimension: one of those with a kernel (`kernel`: which kernels, for the message:
// "" for the forward, " for the backward", " for FP8")
void check_head_dim_in(const Arg& q, std::span<const int> dims, const char* kernel) {
  const int last = q.view.rank - 1;
  const int64_t head_dim = q.view.shape[last];
  if (std::find(dims.begin(), dims.end(), head_dim) != dims.end()) return;
  Message m;
  m << q.name << ": head_dim (shape[" << q.dim(last) << "]) must be one of ";
  for (size_t i = 0; i < dims.size(); ++i) m << (i ? ", " : "") << dims[i];
  m << kernel << ", got " << head_dim;
  fail(m);
}

// ---- e. head dimension, for the 16-bit kernels: a multiple of 8 from 8 to 256 (kernel_head_dim),
// or to 512 for the dense forward and the backward (max_head_dim = kMaxForwardHeadDim:
// forward_kernel_head_dim)
void check_head_dim_supported(const Arg& q, const char* kernel, int max_head_dim = kMaxHeadDim) {
  const int last = q.view.rank - 1;
  const int64_t head_dim = q.view.shape[last];
  const bool wide = max_head_dim > kMaxHeadDim;
  if ((wide ? forward_kernel_head_dim(head_dim) : kernel_head_dim(head_dim)) != 0) return;
  Message m;
  m << q.name << ": head_dim (shape[" << q.dim(last) << "]) must be a multiple of " << kHeadDimStep << " from "
    << kMinHeadDim << " to " << max_head_dim << kernel;
  if (!wide && forward_kernel_head_dim(head_dim) != 0)
    m << " (head dims above 256: the 16-bit forward, dense, packed or over KV caches, and its backward)";
  m << ", got " << head_dim;
  fail(m);
}

// ---- f. shapes. `why` says where the expected shape comes from.
void check_shape(const Arg& a, const int64_t* want, const std::string& why) {
  bool same = true;
  for (int i = 0; i < a.expected_rank; ++i) same = same && a.view.shape[i] == want[i];
  if (same) return;
  Message m;
  m << a.name << ": expected shape (";
  for (int i = a.hidden_dims; i < a.expected_rank; ++i) m << (i > a.hidden_dims ? ", " : "") << want[i];
  m << ") " << why << ", got " << shape_string(a);
  fail(m);
}

// lse's dimensions spelled out: (batch, seqlen, heads), the attention tensors' order, is the
// common mistake.
void check_lse_shape(const Arg& lse, const ProblemSizes& s) {
  if (lse.view.shape[0] == s.batch && lse.view.shape[1] == s.heads_q && lse.view.shape[2] == s.seqlen_q) return;
  Message m;
  if (lse.hidden_dims == 1)  // a packed batch's
    m << lse.name << ": expected shape (heads_q, total_q) = (" << s.heads_q << ", " << s.seqlen_q << ")";
  else
    m << lse.name << ": expected shape (batch, heads_q, seqlen_q) = (" << s.batch << ", " << s.heads_q << ", "
      << s.seqlen_q << ")";
  m << ", got " << shape_string(lse);
  fail(m);
}

// ---- g. grouped-query heads: every query head maps onto one key/value head
// `k`: the name of the tensor whose heads are the key/value heads.
void check_head_groups(int64_t heads_q, int64_t heads_kv, const char* k = "k") {
  if (heads_q >= 1 && heads_kv < 1) {
    Message m;
    m << k << ": expected at least 1 key/value head for " << heads_q << " query heads, got " << heads_kv;
    fail(m);
  }
  if (heads_kv >= 1 && heads_q % heads_kv != 0) {
    Message m;
    m << k << ": query heads (" << heads_q << ") must be a multiple of key/value heads (" << heads_kv << ")";
    fail(m);
  }
}

// ---- h. innermost dimension contiguous (the TMA box and the kernel's vector accesses need it)
void check_last_dim_contiguous(const Arg& a) {
  const int last = a.view.rank - 1;
  if (a.view.stride[last] == 1) return;
  Message m;
  m << a.name << ": last dimension (" << a.dim_names[last] << ") must be contiguous (stride["
    << a.dim(last) << "] == 1), got stride[" << a.dim(last) << "] = " << a.view.stride[last];
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
      m << a.name << ": stride[" << a.dim(i) << "] (" << a.dim_names[i] << ") must not be negative, got "
        << s;
      fail(m);
    }
    // A zero stride over a dimension of size > 1 makes different rows alias one another: a
    // write race for out and lse, and for inputs a broadcast the API does not promise. One rule
    // for every tensor keeps it simple; a size-1 dimension is never stepped over, so any
    // stride is fine there.
    if (s == 0 && t.shape[i] > 1) {
      Message m;
      m << a.name << ": stride[" << a.dim(i) << "] (" << a.dim_names[i]
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
      m << a.name << ": stride[" << a.dim(i) << "] (" << a.dim_names[i] << ") = " << s
        << " elements must be less than 2^40 bytes (TMA)";
      fail(m);
    }
    if ((s * elem) % kTmaAlignBytes != 0) {
      Message m;
      m << a.name << ": stride[" << a.dim(i) << "] (" << a.dim_names[i] << ") = " << s
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
    m << a.name << ": " << a.dim_names[i] << " (shape[" << a.dim(i) << "]) = " << a.view.shape[i]
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

void check_ranges_apart(const char* written, ByteRange w, const char* other, ByteRange o) {
  if (w.last < o.first || o.last < w.first) return;
  Message m;
  m << written << ": must not overlap " << other << " in memory, but " << written << " spans bytes ["
    << hex(w.first) << ", " << hex(w.last) << "] and " << other << " spans [" << hex(o.first) << ", "
    << hex(o.last) << "]";
  fail(m);
}

void check_no_overlap(const Arg& written, const Arg& other) {
  if (is_empty(written.view) || is_empty(other.view)) return;
  check_ranges_apart(written.name, byte_range(written.view), other.name, byte_range(other.view));
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
      m << a.name << ": stride[" << a.dim(i) << "] (" << a.dim_names[i] << ") = " << t.stride[i]
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
void check_softmax_scale(const std::optional<float>& scale) {
  if (!scale) return;
  const float s = *scale;
  if (std::isfinite(s) && s > 0.f) return;
  Message m;
  m << "softmax_scale: expected a finite positive value, got " << s;
  fail(m);
}

float resolved_softmax_scale(const std::optional<float>& scale, int64_t head_dim) {
  return scale ? *scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// ---- l and m for a whole call: every written tensor apart from every other tensor of the
// call (`tensors`, in argument order; each pair checked once, named by the written one that
// comes first in `written`), then each written tensor's elements apart from one another.
void check_written_apart(std::span<const Arg* const> tensors, std::span<const Arg* const> written) {
  for (auto w = written.begin(); w != written.end(); ++w)
    for (const Arg* other : tensors) {
      const bool pair_checked = std::find(written.begin(), w + 1, other) != w + 1;  // itself, or from the other side
      if (!pair_checked) check_no_overlap(**w, *other);
    }
  for (const Arg* w : written) check_no_self_overlap(*w);
}

// ---- the rules a to j for the tensors of an attention call, forward's or backward's.
// One 16-bit tensor of the call and the tensor whose shape it must have: q, (B, Sq, Hq, D), or
// k, (B, Sk, Hkv, D); q and k name themselves.
struct Operand {
  const Arg& arg;
  const Arg& shaped_as;       // batch, sequence and heads as this one
  bool value_head_dim = false;  // head dim as v (out, dout, dv), else as q (q, k, dq, dk)
};

// `operands`: every 16-bit tensor of the call in argument order, q and k among them; `lse`:
// the (B, Hq, Sq) fp32 log-sum-exp, or nullptr. `k_own_batch`: k's first axis is not the batch
// (a paged KV cache's pages), so k and the operands shaped as k keep their own. Returns the
// call's sizes.
ProblemSizes check_attention_tensors(std::span<const Operand> operands, const Arg& q, const Arg& k, const Arg& v,
                                     const Arg* lse, bool k_own_batch = false, int max_head_dim = kMaxHeadDim) {
  // a. rank
  for (const Operand& o : operands) check_rank(o.arg);
  if (lse) check_rank(*lse);

  // b. negative sizes
  for (const Operand& o : operands) check_sizes_not_negative(o.arg);
  if (lse) check_sizes_not_negative(*lse);

  // c. null pointers
  for (const Operand& o : operands) check_not_null(o.arg);
  if (lse) check_not_null(*lse);

  // d. dtypes
  check_16bit_dtype(q);
  for (const Operand& o : operands)
    if (&o.arg != &q) check_dtype(o.arg, q.view.dtype, q.name);
  if (lse) check_dtype(*lse, DType::f32);

  // e. head dimensions: q and k's, and v's (out's, dout's), each one the kernels take; they may
  // differ (MLA's 192/128)
  check_head_dim_supported(q, "", max_head_dim);
  check_head_dim_supported(v, "", max_head_dim);
  const int64_t head_dim = q.view.shape[3], head_dim_v = v.view.shape[3];
  if (forward_kernel_head_dim(head_dim_v) > forward_kernel_head_dim(head_dim)) {
    // The kernel is chosen by q's head dim (and the backward's workspace sized from q alone)
    Message m;
    m << v.name << ": head_dim (shape[" << v.dim(3) << "]) must be at most " << forward_kernel_head_dim(head_dim)
      << " (q's head_dim " << head_dim << " rounded up to "
      << (max_head_dim > kMaxHeadDim ? "64, 128, 256 or 512" : "64, 128 or 256") << "), got " << head_dim_v;
    fail(m);
  }
  for (const Operand& o : operands) {
    const Arg& like = o.value_head_dim ? v : q;
    if (o.arg.view.shape[3] == like.view.shape[3]) continue;
    Message m;
    m << o.arg.name << ": expected head_dim " << like.view.shape[3] << " (same as " << like.name << "), got "
      << o.arg.view.shape[3];
    fail(m);
  }

  // f. batch and shape agreement
  ProblemSizes sizes{q.view.shape[0], q.view.shape[1], k.view.shape[1], q.view.shape[2], k.view.shape[2], head_dim};
  sizes.head_dim_v = head_dim_v;
  for (const Operand& o : operands) {
    if (o.arg.view.shape[0] == sizes.batch || (k_own_batch && &o.shaped_as == &k)) continue;
    Message m;
    m << o.arg.name << ": expected batch " << sizes.batch << " (same as " << q.name << "), got " << o.arg.view.shape[0];
    fail(m);
  }
  for (const Operand& o : operands) {
    if (&o.arg == &o.shaped_as) continue;
    const int64_t* s = o.shaped_as.view.shape;
    const int64_t want[4] = {s[0], s[1], s[2], o.value_head_dim ? head_dim_v : head_dim};
    const bool as_is = want[3] == s[3];
    const char* tail = as_is ? ")" : o.value_head_dim ? ", head_dim as v)" : ", head_dim as q)";
    check_shape(o.arg, want, std::string("(same as ") + o.shaped_as.name + tail);
  }
  if (lse) check_lse_shape(*lse, sizes);

  // g. grouped-query heads
  check_head_groups(sizes.heads_q, sizes.heads_kv, k.name);

  // h. innermost dimension contiguous (lse is accessed with plain fp32 loads and stores, not
  // by TMA: any positive strides will do)
  for (const Operand& o : operands) check_last_dim_contiguous(o.arg);

  // i. alignment and strides
  for (const Operand& o : operands) check_tma_layout(o.arg);
  if (lse) check_fp32_layout(*lse, 3);

  // j. 32-bit coordinates (every other tensor matches q or k, so they cover every size)
  check_coordinates_fit(q);
  check_coordinates_fit(k);
  return sizes;
}

// ---- p. model options (ForwardOptions): the sliding window, softcap and sinks. `fp8`: the
// call is forward_fp8's, which has no softcap (its scores are scaled per block in the softmax's
// exponent, where a tanh does not fit).
const char* const kSinksDimNames[1] = {"heads_q"};
std::optional<Arg> sinks_arg(const ForwardOptions& o) {
  if (!o.sinks) return std::nullopt;
  return Arg{"sinks", *o.sinks, kSinksDimNames, 1};
}
// The window's sides; a window needs seqlen_q + seqlen_k < 2^30, which keeps the kernels'
// 32-bit band arithmetic exact (kv_tiles.hpp).
void check_window(int left, int right, bool causal, const ProblemSizes& sizes) {
  for (const auto& [name, value] : {std::pair{"window_left", left}, std::pair{"window_right", right}}) {
    if (value >= -1) continue;
    Message m;
    m << "options." << name << ": expected -1 (unbounded) or a key count >= 0, got " << value;
    fail(m);
  }
  if (causal && right > 0) {
    Message m;
    m << "options.window_right: causal attention sees no key right of the diagonal, expected -1 or 0 with causal, got "
      << right;
    fail(m);
  }
  if ((left >= 0 || right >= 0) && sizes.seqlen_q + sizes.seqlen_k >= kUnbounded) {
    Message m;
    m << "options.window_left/right: a sliding window needs seqlen_q + seqlen_k below 2^30, got " << sizes.seqlen_q
      << " + " << sizes.seqlen_k;
    fail(m);
  }
}

// The band of keys each row sees (kv_tiles.hpp) for causal and a window; a side wider than both
// lengths bounds nothing: kUnbounded, so every value fits the kernels' int.
KeyBand resolved_band(int left, int right, bool causal, const ProblemSizes& sizes) {
  const auto side = [&](int w) {
    return w < 0 || static_cast<int64_t>(w) >= sizes.seqlen_q + sizes.seqlen_k ? kUnbounded : w;
  };
  return {side(left), causal ? 0 : side(right)};
}

void check_softcap(float softcap) {
  if (std::isfinite(softcap) && softcap >= 0.f) return;
  Message m;
  m << "options.softcap: expected 0 (off) or a finite value > 0, got " << softcap;
  fail(m);
}

void check_model_options(const ForwardOptions& o, const ProblemSizes& sizes, bool fp8) {
  check_window(o.window_left, o.window_right, o.causal, sizes);
  check_softcap(o.softcap);
  if (fp8 && o.softcap != 0.f) {
    Message m;
    m << "options.softcap: forward_fp8 has no softcap (16-bit forward only), got " << o.softcap;
    fail(m);
  }
  if (const std::optional<Arg> a = sinks_arg(o)) {
    check_rank(*a);
    check_sizes_not_negative(*a);
    check_not_null(*a);
    check_dtype(*a, DType::f32);
    const int64_t want[1] = {sizes.heads_q};
    check_shape(*a, want, "(one logit per query head)");
    check_fp32_layout(*a, 1);
  }
}

// What dispatch needs of a validated call (rules a to p passed); the softmax scale resolved to
// its default, the window and causal mask to the band of keys each row sees (kv_tiles.hpp).
ForwardProblem forward_problem(const ProblemSizes& sizes, DType dtype, const ForwardOptions& options, bool has_lse) {
  ForwardProblem p;
  static_cast<ProblemSizes&>(p) = sizes;
  p.dtype = dtype;
  p.softmax_scale = resolved_softmax_scale(options.softmax_scale, sizes.head_dim);
  p.causal = options.causal;
  p.has_lse = has_lse;
  p.batch_invariant = options.batch_invariant;
  p.band = resolved_band(options.window_left, options.window_right, options.causal, sizes);
  p.banded = p.band.left != kUnbounded || p.band.right != kUnbounded;
  p.softcap = options.softcap;
  if (options.sinks) {
    p.sinks = static_cast<const float*>(options.sinks->data);
    p.sinks_stride = options.sinks->stride[0];
  }
  return p;
}

// The sinks among a call's tensors for the overlap rules (read, never written).
void add_sinks(std::vector<const Arg*>& tensors, const std::optional<Arg>& sinks) {
  if (sinks) tensors.push_back(&*sinks);
}
// The forward's last two for the overlap rules: the sinks (read) and lse (written), where given.
void add_sinks_and_lse(std::vector<const Arg*>& tensors, std::vector<const Arg*>& written,
                       const std::optional<Arg>& sinks, const Arg* lse) {
  add_sinks(tensors, sinks);
  if (lse) {
    tensors.push_back(lse);
    written.push_back(lse);
  }
}

// ---- n. the backward's workspace.
// The bytes a backward problem needs, by the Hopper layout, whose int64 arithmetic must not
// overflow: so a shape whose workspace would pass 2^62 bytes (far beyond any device) is refused
// first, by a bound in saturating arithmetic. The bound is the layout's O(B x Hq x Sq x D)
// (dQ's fp32 accumulator, two fp32 row terms, a turn counter per 64 rows, each region padded to
// 256 bytes) with room to spare; `q` names the shape in the message.
size_t backward_workspace_bytes_of(const Arg& q, const BackwardProblem& p) {
  constexpr uint64_t kLimit = uint64_t(1) << 62;
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  // Rows per (batch, head): seqlen_q rounded up to the granule (128; 320 with an 80-row d = 128
  // kernel, a build knob that this host file does not see: the largest); a packed batch's: one
  // batch of total_q + a granule per sequence (workspace.hpp's padding).
  constexpr uint64_t g = kBackwardMaxRowGranule;
  const uint64_t rows = p.varlen ? saturating_add(u(p.seqlen_q), saturating_mul(saturating_add(u(p.batch), 1), g))
                                 : saturating_add(u(p.seqlen_q), g);
  const uint64_t row_count = saturating_mul(saturating_mul(p.varlen ? 1 : u(p.batch), u(p.heads_q)), rows);
  const uint64_t columns = u(p.backward_kernel_dim());  // dQ's accumulator: the kernel's columns
  const uint64_t bound = saturating_add(saturating_mul(row_count, saturating_mul(saturating_add(columns, 3), 4)), 1024);
  if (bound >= kLimit) {
    Message m;
    m << q.name << ": shape " << shape_string(q) << " needs a backward workspace of more than 2^62 bytes";
    fail(m);
  }
  return backward_workspace_bytes_sm90(p);
}

// The kernels write the workspace while they read every tensor and write the gradients, so it
// must be apart from all of them; the whole range the caller gave counts, as the call may use
// it all (Workspace). Null is fine only when no byte is needed.
void check_workspace(const Workspace& w, size_t needed, std::span<const Arg* const> tensors) {
  if (w.data == nullptr) {
    if (needed == 0) return;
    Message m;
    m << "workspace: data is null, expected a device pointer to at least " << needed
      << " bytes (backward_workspace_bytes)";
    fail(m);
  }
  const uint64_t address = reinterpret_cast<uintptr_t>(w.data);
  if (address % kWorkspaceAlignBytes != 0) {
    Message m;
    m << "workspace: data pointer " << hex(address) << " must be " << kWorkspaceAlignBytes << "-byte aligned";
    fail(m);
  }
  if (w.bytes < needed) {
    Message m;
    m << "workspace: expected at least " << needed << " bytes (backward_workspace_bytes), got " << w.bytes;
    fail(m);
  }
  if (w.bytes == 0) return;
  const ByteRange range{address, saturating_add(address, w.bytes - 1)};
  for (const Arg* t : tensors)
    if (!is_empty(t->view)) check_ranges_apart("workspace", range, t->name, byte_range(t->view));
}

}  // namespace

ForwardProblem validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const std::optional<TensorView>& lse,
                                const ForwardOptions& options) {
  const Arg aq{"q", q, kAttentionDimNames, 4};
  const Arg ak{"k", k, kAttentionDimNames, 4};
  const Arg av{"v", v, kAttentionDimNames, 4};
  const Arg aout{"out", out, kAttentionDimNames, 4};
  const TensorView no_lse;
  const Arg alse{"lse", lse ? *lse : no_lse, kLseDimNames, 3};
  const Operand operands[4] = {{aq, aq}, {ak, ak}, {av, ak, true}, {aout, aq, true}};

  // a to j (head dims up to 512: the dense forward's)
  const ProblemSizes sizes =
      check_attention_tensors(operands, aq, ak, av, lse ? &alse : nullptr, false, kMaxForwardHeadDim);

  // k. softmax scale; p. window, softcap, sinks
  check_softmax_scale(options.softmax_scale);
  check_model_options(options, sizes, false);

  // l. outputs must not alias anything else the call reads or writes; m. each written element
  // at its own address
  std::vector<const Arg*> tensors = {&aq, &ak, &av, &aout}, written = {&aout};
  const std::optional<Arg> asinks = sinks_arg(options);
  add_sinks_and_lse(tensors, written, asinks, lse ? &alse : nullptr);
  check_written_apart(tensors, written);

  return forward_problem(sizes, q.dtype, options, lse.has_value());
}

// ---- Packed variable-length batches (warpattn.hpp, VarlenBatch). The tensors are checked by
// the rules a to m as (1, total, heads, head_dim) views (Arg::hidden_dims keeps the messages in
// the caller's numbering), after their ranks; then the offsets (rules o1 to o6).
namespace {

const char* const kPackedDimNames[4] = {"", "total", "heads", "head_dim"};
const char* const kPackedLseDimNames[3] = {"", "heads", "total_q"};
const char* const kOffsetDimNames[1] = {"batch + 1"};
const char* const kSequsedDimNames[1] = {"batch"};

// t with a leading dimension of size 1 (stride 0: never stepped over).
TensorView with_unit_batch(const TensorView& t) {
  TensorView v = t;
  v.rank = t.rank + 1;
  v.shape[0] = 1;
  v.stride[0] = 0;
  for (int i = 0; i < t.rank && i < 3; ++i) {
    v.shape[i + 1] = t.shape[i];
    v.stride[i + 1] = t.stride[i];
  }
  return v;
}

// o1 to o4 for one int32 array of the batch: rank 1, `length` entries (when known: >= 0),
// int32, device data, contiguous, 4-byte aligned.
void check_offsets_array(const Arg& a, int64_t length, const char* length_why) {
  check_rank(a);
  check_sizes_not_negative(a);
  check_dtype(a, DType::s32);
  if (length >= 0 && a.view.shape[0] != length) {
    Message m;
    m << a.name << ": expected " << length << " entries " << length_why << ", got " << a.view.shape[0];
    fail(m);
  }
  check_not_null(a);
  if (a.view.shape[0] > 1 && a.view.stride[0] != 1) {
    Message m;
    m << a.name << ": must be contiguous (stride[0] == 1), got stride[0] = " << a.view.stride[0];
    fail(m);
  }
  check_fp32_layout(a, 0);  // 4-byte alignment (int32 like fp32)
}

// The offsets of a packed batch under check (rules o1 to o6), and their Args for the overlap rules.
struct VarlenArgs {
  const VarlenBatch& batch;
  const TensorView no_seqused;
  const Arg acq, ack, aused;
  explicit VarlenArgs(const VarlenBatch& b)
      : batch(b),
        no_seqused(),
        acq{"cu_seqlens_q", b.cu_seqlens_q, kOffsetDimNames, 1},
        ack{"cu_seqlens_k", b.cu_seqlens_k, kOffsetDimNames, 1},
        aused{"seqused_k", b.seqused_k ? *b.seqused_k : no_seqused, kSequsedDimNames, 1} {}

  // o1 to o6; returns the number of sequences. The plan's table holds a tile per `block` rows
  // of each sequence (of `total` rows, at most total / block + batch per head) for `heads` heads:
  // within 32-bit indices. `tiled`: the tensor whose rows are tiled, for the message.
  int64_t check(int64_t total, int block, int64_t heads, const char* tiled) const {
    check_offsets_array(acq, -1, "");
    if (batch.cu_seqlens_q.shape[0] < 1) fail(Message() << "cu_seqlens_q: expected batch + 1 >= 1 entries, got 0");
    const int64_t sequences = batch.cu_seqlens_q.shape[0] - 1;
    check_offsets_array(ack, sequences + 1, "(batch + 1, as cu_seqlens_q)");
    if (batch.seqused_k) check_offsets_array(aused, sequences, "(batch, one per sequence of cu_seqlens_q)");
    // o5. the longest sequences: not needed, but a negative length is a mistake
    if (batch.max_seqlen_q < 0 || batch.max_seqlen_k < 0)
      fail(Message() << (batch.max_seqlen_q < 0 ? "max_seqlen_q" : "max_seqlen_k") << ": expected >= 0, got "
                     << (batch.max_seqlen_q < 0 ? batch.max_seqlen_q : batch.max_seqlen_k));
    // o6. the plan's table
    const uint64_t table = saturating_mul(
        saturating_add(static_cast<uint64_t>(total) / block, static_cast<uint64_t>(sequences)), static_cast<uint64_t>(heads));
    if (table >= static_cast<uint64_t>(kCoordinateLimit)) {
      Message m;
      m << "cu_seqlens_q: heads x (" << tiled << " rows / " << block << " + batch) = " << table
        << " work tiles must be less than 2^31 (the kernel uses 32-bit tile indices)";
      fail(m);
    }
    return sequences;
  }
  void add_to(std::vector<const Arg*>& tensors) const {
    tensors.push_back(&acq);
    tensors.push_back(&ack);
    if (batch.seqused_k) tensors.push_back(&aused);
  }
};

VarlenSequences device_sequences(const VarlenBatch& batch, const ProblemSizes& packed) {
  VarlenSequences s;
  s.cu_seqlens_q = static_cast<const int*>(batch.cu_seqlens_q.data);
  s.cu_seqlens_k = static_cast<const int*>(batch.cu_seqlens_k.data);
  s.seqused_k = batch.seqused_k ? static_cast<const int*>(batch.seqused_k->data) : nullptr;
  s.batch = static_cast<int>(batch.cu_seqlens_q.shape[0] - 1);
  s.total_q = static_cast<int>(packed.seqlen_q);
  s.total_k = static_cast<int>(packed.seqlen_k);
  s.max_seqlen_q = batch.max_seqlen_q;
  return s;
}

// Rule a for a packed call's tensors, as the caller has them: rank 3 (total, heads, head_dim),
// lse rank 2 (heads, total_q).
void check_packed_ranks(std::initializer_list<std::pair<const char*, const TensorView*>> tensors, const char* lse_name,
                        const TensorView* lse) {
  for (const auto& [name, t] : tensors) check_rank(Arg{name, *t, kPackedDimNames + 1, 3});
  if (lse) check_rank(Arg{lse_name, *lse, kPackedLseDimNames + 1, 2});
}

}  // namespace

namespace {

// The rules of backward() over t's views; a packed batch (`varlen`: its offsets) has them as
// (1, total, heads, head_dim) views (lse (1, heads, total_q)), checked in the caller's
// numbering, and the offset rules o1 to o6 after rule k.
BackwardProblem validate_backward_views(const BackwardTensors& t, const BackwardOptions& options,
                                        const std::optional<Workspace>& workspace, const VarlenBatch* varlen) {
  const int hidden = varlen ? 1 : 0;
  const char* const* names = varlen ? kPackedDimNames : kAttentionDimNames;
  const char* const* lse_names = varlen ? kPackedLseDimNames : kLseDimNames;
  const Arg adout{"dout", t.dout, names, 4, hidden};
  const Arg aq{"q", t.q, names, 4, hidden};
  const Arg ak{"k", t.k, names, 4, hidden};
  const Arg av{"v", t.v, names, 4, hidden};
  const Arg aout{"out", t.out, names, 4, hidden};
  const Arg alse{"lse", t.lse, lse_names, 3, hidden};
  const Arg adq{"dq", t.dq, names, 4, hidden};
  const Arg adk{"dk", t.dk, names, 4, hidden};
  const Arg adv{"dv", t.dv, names, 4, hidden};
  const Operand operands[8] = {{adout, aq, true}, {aq, aq},   {ak, ak},   {av, ak, true},
                               {aout, aq, true},  {adq, aq}, {adk, ak}, {adv, ak, true}};

  // a to j (head dims up to 512, as the dense forward: the 512 kernel takes 264..512)
  ProblemSizes sizes = check_attention_tensors(operands, aq, ak, av, &alse, false, kMaxForwardHeadDim);
  // g, for the backward: dk and dv are written, and only through the query heads of their
  // group, so key/value heads without any query head would be left unwritten (the forward
  // only reads k and v, and may take them).
  if (sizes.heads_q == 0 && sizes.heads_kv > 0) {
    Message m;
    m << "k: expected 0 key/value heads for 0 query heads (dk and dv are computed from their query heads), got "
      << sizes.heads_kv;
    fail(m);
  }

  // e, for the backward: a head dim with a backward kernel (every one the dense forward has)
  check_head_dim_supported(aq, " for the backward", kMaxForwardHeadDim);

  // k. softmax scale
  check_softmax_scale(options.softmax_scale);
  check_window(options.window_left, options.window_right, options.causal, sizes);
  check_softcap(options.softcap);  // (at head dims 64 or less the 128 kernel runs it: backward_kernel_dim)

  // p, the sinks: as the forward's, and their gradient dsinks, written, shaped as them
  const char* const* sink_names = kSinksDimNames;
  std::optional<Arg> asinks, adsinks;
  if (options.sinks) asinks.emplace(Arg{"sinks", *options.sinks, sink_names, 1});
  if (options.dsinks) adsinks.emplace(Arg{"dsinks", *options.dsinks, sink_names, 1});
  if (asinks.has_value() != adsinks.has_value()) {
    Message m;
    if (asinks)
      m << "dsinks: expected a (heads_q) float32 tensor for the sinks' gradient, got none";
    else
      m << "dsinks: given without sinks (the forward call's sinks), expected none";
    fail(m);
  }
  for (const std::optional<Arg>* a : {&asinks, &adsinks}) {
    if (!*a) continue;
    check_rank(**a);
    check_sizes_not_negative(**a);
    check_not_null(**a);
    check_dtype(**a, DType::f32);
    const int64_t want[1] = {sizes.heads_q};
    check_shape(**a, want, "(one per query head)");
    check_fp32_layout(**a, 1);
  }

  // o1 to o6 for a packed batch: the backward's tiles are key blocks (of 64 keys at the
  // smallest) of each KV head; the 512 kernel runs two CTAs per tile (one per column half), so
  // there they count twice
  std::vector<const Arg*> tensors = {&adout, &aq, &ak, &av, &aout, &alse, &adq, &adk, &adv};
  std::optional<VarlenArgs> va;
  if (varlen) {
    va.emplace(*varlen);
    sizes.batch = va->check(sizes.seqlen_k, 64, sizes.heads_kv * (sizes.kernel_dim() == 512 ? 2 : 1), "k");
    va->add_to(tensors);
  }

  // l, m. the gradients apart from every other argument and from one another
  std::vector<const Arg*> written = {&adq, &adk, &adv};
  if (asinks) {
    tensors.push_back(&*asinks);
    tensors.push_back(&*adsinks);
    written.push_back(&*adsinks);
  }
  check_written_apart(tensors, written);

  BackwardProblem p;
  static_cast<ProblemSizes&>(p) = sizes;
  p.dtype = t.q.dtype;
  p.softmax_scale = resolved_softmax_scale(options.softmax_scale, sizes.head_dim);
  p.causal = options.causal;
  p.deterministic = options.deterministic || options.batch_invariant;
  p.varlen = varlen != nullptr;
  p.band = resolved_band(options.window_left, options.window_right, options.causal, sizes);
  p.banded = p.band.left != kUnbounded || p.band.right != kUnbounded;
  p.softcap = options.softcap;
  if (asinks) {
    p.sinks = static_cast<const float*>(options.sinks->data);
    p.sinks_stride = options.sinks->stride[0];
    p.dsinks = static_cast<float*>(options.dsinks->data);
    p.dsinks_stride = options.dsinks->stride[0];
  }

  // n. workspace
  const size_t needed = backward_workspace_bytes_of(aq, p);
  if (workspace) check_workspace(*workspace, needed, tensors);
  return p;
}

}  // namespace

BackwardProblem validate_backward(const BackwardTensors& t, const BackwardOptions& options,
                                  const std::optional<Workspace>& workspace) {
  return validate_backward_views(t, options, workspace, nullptr);
}

VarlenBackwardCall validate_backward_varlen(const BackwardTensors& t, const VarlenBatch& batch,
                                            const BackwardOptions& options, const std::optional<Workspace>& workspace) {
  check_packed_ranks({{"dout", &t.dout}, {"q", &t.q}, {"k", &t.k}, {"v", &t.v}, {"out", &t.out}}, "lse", &t.lse);
  check_packed_ranks({{"dq", &t.dq}, {"dk", &t.dk}, {"dv", &t.dv}}, "", nullptr);
  VarlenBackwardCall call;
  call.t = {with_unit_batch(t.dout), with_unit_batch(t.q),   with_unit_batch(t.k),
            with_unit_batch(t.v),    with_unit_batch(t.out), with_unit_batch(t.lse),
            with_unit_batch(t.dq),   with_unit_batch(t.dk),  with_unit_batch(t.dv)};
  call.problem = validate_backward_views(call.t, options, workspace, &batch);
  call.seqs = device_sequences(batch, call.problem);
  return call;
}

namespace {

// What the workspace size depends on, from q: (B, Sq, Hq, D), or a packed (total_q, Hq, D).
BackwardProblem workspace_problem(const TensorView& q, int64_t batch, const BackwardOptions& options, bool varlen) {
  const int r = varlen ? -1 : 0;  // q's dimensions past the batch one
  BackwardProblem p;
  p.batch = batch;
  p.seqlen_q = q.shape[1 + r];
  p.heads_q = q.shape[2 + r];
  p.head_dim = q.shape[3 + r];
  p.dtype = q.dtype;
  p.causal = options.causal;
  p.deterministic = options.deterministic || options.batch_invariant;
  p.varlen = varlen;
  p.softcap = options.softcap;  // at head dims 64 or less: the 128 kernel's columns (backward_kernel_dim)
  if (options.sinks) p.sinks = static_cast<const float*>(options.sinks->data);  // their partial sums' room
  return p;
}

}  // namespace

size_t backward_workspace_bytes(const TensorView& q, const BackwardOptions& options) {
  const Arg aq{"q", q, kAttentionDimNames, 4};
  check_rank(aq);
  check_sizes_not_negative(aq);
  return backward_workspace_bytes_of(aq, workspace_problem(q, q.shape[0], options, false));
}

size_t backward_varlen_workspace_bytes(const TensorView& q, int64_t batch, const BackwardOptions& options) {
  const Arg aq{"q", q, kPackedDimNames + 1, 3};
  check_rank(aq);
  check_sizes_not_negative(aq);
  if (batch < 0) fail(Message() << "batch: expected the number of sequences (>= 0), got " << batch);
  return backward_workspace_bytes_of(aq, workspace_problem(q, batch, options, true));
}

// ---- FP8 (warpattn/fp8.hpp). The same rule letters, in the same order.
namespace {

const char* const kVtDimNames[4] = {"batch", "heads", "head_dim", "keys"};
const char* const kDescaleDimNames[3] = {"batch", "heads", "blocks"};

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

namespace {

const char* const kPackedVtDimNames[4] = {"", "heads", "head_dim", "keys"};
const char* const kPackedDescaleDimNames[3] = {"", "heads", "blocks"};

// The FP8 operands' rules over views of rank 4 (q, k, vt) and 3 (descales); a packed batch's
// (`sequences` >= 0) as (1, ...) views of its rank-3 and rank-2 tensors, whose Vᵀ and descales
// hold each sequence from its padded row (fp8_varlen_rows).
ProblemSizes check_fp8_operands(const Fp8Operands& f, int64_t sequences) {
  const bool packed = sequences >= 0;
  const int hidden = packed ? 1 : 0;
  const char* const* names = packed ? kPackedDimNames : kAttentionDimNames;
  const char* const* vt_names = packed ? kPackedVtDimNames : kVtDimNames;
  const char* const* descale_names = packed ? kPackedDescaleDimNames : kDescaleDimNames;
  const Arg aq{"q", f.q, names, 4, hidden}, ak{"k", f.k, names, 4, hidden}, avt{"vt", f.vt, vt_names, 4, hidden},
      aqs{"q_descale", f.q_descale, descale_names, 3, hidden}, aks{"k_descale", f.k_descale, descale_names, 3, hidden},
      avs{"v_descale", f.v_descale, descale_names, 3, hidden};
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
  check_head_dim_in(aq, kFp8HeadDims, " for FP8");
  const int64_t head_dim = f.q.shape[3];
  ProblemSizes p;
  p.batch = f.q.shape[0];
  p.seqlen_q = f.q.shape[1];
  p.heads_q = f.q.shape[2];
  p.head_dim = head_dim;
  p.seqlen_k = f.k.shape[1];
  p.heads_kv = f.k.shape[2];
  const int64_t k_want[4] = {p.batch, p.seqlen_k, p.heads_kv, head_dim};
  check_shape(ak, k_want, packed ? "(head_dim as q)" : "(batch and head_dim as q)");
  if (packed) {
    const int64_t rows_q = fp8_varlen_rows(p.seqlen_q, sequences), rows_k = fp8_varlen_rows(p.seqlen_k, sequences);
    const int64_t vt_want[4] = {1, p.heads_kv, head_dim, rows_k};
    check_shape(avt, vt_want, "(heads_kv, head_dim, fp8_varlen_rows(total_k, batch))");
    const int64_t qs_want[3] = {1, p.heads_q, rows_q / kFp8BlockRows};
    check_shape(aqs, qs_want, "(heads_q, fp8_varlen_rows(total_q, batch) / 128)");
    const int64_t kvs_want[3] = {1, p.heads_kv, rows_k / kFp8BlockRows};
    check_shape(aks, kvs_want, "(heads_kv, fp8_varlen_rows(total_k, batch) / 128)");
    check_shape(avs, kvs_want, "(heads_kv, fp8_varlen_rows(total_k, batch) / 128)");
  } else {
    const int64_t vt_want[4] = {p.batch, p.heads_kv, head_dim, fp8_padded_keys(p.seqlen_k)};
    check_shape(avt, vt_want, "(batch, heads_kv, head_dim, seqlen_k rounded up to 16)");
    const int64_t qs_want[3] = {p.batch, p.heads_q, blocks_of(p.seqlen_q)};
    check_shape(aqs, qs_want, "(batch, heads_q, ceil(seqlen_q / 128))");
    const int64_t kvs_want[3] = {p.batch, p.heads_kv, blocks_of(p.seqlen_k)};
    check_shape(aks, kvs_want, "(batch, heads_kv, ceil(seqlen_k / 128))");
    check_shape(avs, kvs_want, "(batch, heads_kv, ceil(seqlen_k / 128))");
  }
  check_head_groups(p.heads_q, p.heads_kv);
  for (const Arg* a : tensors) check_last_dim_contiguous(*a);
  for (const Arg* a : tensors) check_tma_layout(*a);
  for (const Arg* a : scales) check_fp32_layout(*a, 2);
  for (const Arg* a : scales) check_descale_block_stride(*a, false);
  check_coordinates_fit(aq);
  check_coordinates_fit(ak);
  check_coordinates_fit(avt);
  return p;
}

}  // namespace

ProblemSizes validate_fp8_operands(const Fp8Operands& f) { return check_fp8_operands(f, -1); }

namespace {

// quantize_fp8's rules; a packed batch's (sequences >= 0) over (1, ...) views (check_fp8_operands).
ProblemSizes check_quantize(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& f,
                            int64_t sequences) {
  const bool packed = sequences >= 0;
  const int hidden = packed ? 1 : 0;
  const char* const* names = packed ? kPackedDimNames : kAttentionDimNames;
  // The inputs first, by forward()'s rules (with q standing in for out, which is not written):
  // rank, sizes, null, dtype, head dim, shapes, GQA, layout.
  const Arg aq{"q", q, names, 4, hidden}, ak{"k", k, names, 4, hidden}, av{"v", v, names, 4, hidden};
  const Arg* const inputs[3] = {&aq, &ak, &av};
  for (const Arg* a : inputs) check_rank(*a);
  for (const Arg* a : inputs) check_sizes_not_negative(*a);
  for (const Arg* a : inputs) check_not_null(*a);
  check_16bit_dtype(aq);
  for (const Arg* a : {&ak, &av}) check_dtype(*a, q.dtype);
  const ProblemSizes p = check_fp8_operands(f, sequences);
  const Arg fq{"fp8.q", f.q, names, 4, hidden}, fk{"fp8.k", f.k, names, 4, hidden};
  check_shape(aq, f.q.shape, "(same as fp8.q)");
  check_shape(ak, f.k.shape, "(same as fp8.k)");
  check_shape(av, f.k.shape, "(same as fp8.k)");
  for (const Arg* a : inputs) check_last_dim_contiguous(*a);
  for (const Arg* a : inputs) check_tma_layout(*a);
  const char* const* vt_names = packed ? kPackedVtDimNames : kVtDimNames;
  const char* const* descale_names = packed ? kPackedDescaleDimNames : kDescaleDimNames;
  const Arg avt{"fp8.vt", f.vt, vt_names, 4, hidden}, aqs{"fp8.q_descale", f.q_descale, descale_names, 3, hidden},
      aks{"fp8.k_descale", f.k_descale, descale_names, 3, hidden},
      avs{"fp8.v_descale", f.v_descale, descale_names, 3, hidden};
  for (const Arg* a : {&aqs, &aks, &avs}) check_descale_block_stride(*a, true);
  const Arg* const tensors[9] = {&aq, &ak, &av, &fq, &fk, &avt, &aqs, &aks, &avs};
  const Arg* const outputs[6] = {&fq, &fk, &avt, &aqs, &aks, &avs};
  check_written_apart(tensors, outputs);
  return p;
}

// forward_fp8's rules; a packed batch's as check_quantize. `extra`: further tensors the call
// reads (a packed batch's offsets), for the overlap rule.
ForwardProblem check_forward_fp8(const Fp8Operands& f, const TensorView& out, const std::optional<TensorView>& lse,
                                 const ForwardOptions& options, int64_t sequences,
                                 const std::vector<const Arg*>& extra = {}) {
  const bool packed = sequences >= 0;
  const int hidden = packed ? 1 : 0;
  const char* const* names = packed ? kPackedDimNames : kAttentionDimNames;
  const ProblemSizes p = check_fp8_operands(f, sequences);
  const Arg aout{"out", out, names, 4, hidden};
  const TensorView no_lse;
  const Arg alse{"lse", lse ? *lse : no_lse, packed ? kPackedLseDimNames : kLseDimNames, 3, hidden};
  check_rank(aout);
  if (lse) check_rank(alse);
  check_sizes_not_negative(aout);
  if (lse) check_sizes_not_negative(alse);
  check_not_null(aout);
  if (lse) check_not_null(alse);
  check_16bit_dtype(aout);
  if (lse) check_dtype(alse, DType::f32);
  check_shape(aout, f.q.shape, "(same as q)");
  if (lse) check_lse_shape(alse, p);
  check_last_dim_contiguous(aout);
  check_tma_layout(aout);
  if (lse) check_fp32_layout(alse, 3);
  check_softmax_scale(options.softmax_scale);
  check_model_options(options, p, true);
  const char* const* vt_names = packed ? kPackedVtDimNames : kVtDimNames;
  const char* const* descale_names = packed ? kPackedDescaleDimNames : kDescaleDimNames;
  const Arg aq{"q", f.q, names, 4, hidden}, ak{"k", f.k, names, 4, hidden}, avt{"vt", f.vt, vt_names, 4, hidden},
      aqs{"q_descale", f.q_descale, descale_names, 3, hidden}, aks{"k_descale", f.k_descale, descale_names, 3, hidden},
      avs{"v_descale", f.v_descale, descale_names, 3, hidden};
  std::vector<const Arg*> tensors = {&aq, &ak, &avt, &aqs, &aks, &avs, &aout}, written = {&aout};
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  const std::optional<Arg> asinks = sinks_arg(options);
  add_sinks_and_lse(tensors, written, asinks, lse ? &alse : nullptr);
  check_written_apart(tensors, written);
  return forward_problem(p, out.dtype, options, lse.has_value());
}

// The operands of a packed call as (1, ...) views, after their ranks as the caller has them.
Fp8Operands packed_fp8_operands(const Fp8Operands& f, const char* prefix) {
  const std::string n = prefix;
  const std::string q = n + "q", k = n + "k", vt = n + "vt", qs = n + "q_descale", ks = n + "k_descale",
                    vs = n + "v_descale";
  check_rank(Arg{q.c_str(), f.q, kPackedDimNames + 1, 3});
  check_rank(Arg{k.c_str(), f.k, kPackedDimNames + 1, 3});
  check_rank(Arg{vt.c_str(), f.vt, kPackedVtDimNames + 1, 3});
  check_rank(Arg{qs.c_str(), f.q_descale, kPackedDescaleDimNames + 1, 2});
  check_rank(Arg{ks.c_str(), f.k_descale, kPackedDescaleDimNames + 1, 2});
  check_rank(Arg{vs.c_str(), f.v_descale, kPackedDescaleDimNames + 1, 2});
  return {with_unit_batch(f.q),         with_unit_batch(f.k),         with_unit_batch(f.vt),
          with_unit_batch(f.q_descale), with_unit_batch(f.k_descale), with_unit_batch(f.v_descale)};
}

}  // namespace

ProblemSizes validate_quantize(const TensorView& q, const TensorView& k, const TensorView& v, const Fp8Operands& f) {
  return check_quantize(q, k, v, f, -1);
}

ForwardProblem validate_forward_fp8(const Fp8Operands& f, const TensorView& out, const std::optional<TensorView>& lse,
                                    const ForwardOptions& options) {
  return check_forward_fp8(f, out, lse, options, -1);
}

VarlenFp8Call validate_quantize_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const Fp8Operands& f, const VarlenBatch& batch) {
  check_packed_ranks({{"q", &q}, {"k", &k}, {"v", &v}}, "", nullptr);
  VarlenFp8Call call;
  call.f = packed_fp8_operands(f, "fp8.");
  call.q = with_unit_batch(q), call.k = with_unit_batch(k), call.v = with_unit_batch(v);
  const VarlenArgs va(batch);
  // The offsets' rules before the operands' shapes, which depend on the number of sequences.
  check_sizes_not_negative(Arg{"q", q, kPackedDimNames + 1, 3});
  const int64_t sequences = va.check(q.shape[0], 128, q.shape[1], "q");
  const ProblemSizes p = check_quantize(call.q, call.k, call.v, call.f, sequences);
  // The offsets apart from what is written.
  const Arg fq{"fp8.q", call.f.q, kPackedDimNames, 4, 1}, fk{"fp8.k", call.f.k, kPackedDimNames, 4, 1},
      fvt{"fp8.vt", call.f.vt, kPackedVtDimNames, 4, 1},
      fqs{"fp8.q_descale", call.f.q_descale, kPackedDescaleDimNames, 3, 1},
      fks{"fp8.k_descale", call.f.k_descale, kPackedDescaleDimNames, 3, 1},
      fvs{"fp8.v_descale", call.f.v_descale, kPackedDescaleDimNames, 3, 1};
  std::vector<const Arg*> tensors = {&fq, &fk, &fvt, &fqs, &fks, &fvs};
  const std::vector<const Arg*> written = tensors;
  va.add_to(tensors);
  check_written_apart(tensors, written);
  static_cast<ProblemSizes&>(call.problem) = p;
  call.problem.batch = sequences;
  call.seqs = device_sequences(batch, p);
  return call;
}

VarlenFp8Call validate_forward_fp8_varlen(const Fp8Operands& f, const TensorView& out,
                                          const std::optional<TensorView>& lse, const VarlenBatch& batch,
                                          const ForwardOptions& options) {
  VarlenFp8Call call;
  call.f = packed_fp8_operands(f, "");
  check_packed_ranks({{"out", &out}}, "lse", lse ? &*lse : nullptr);
  call.out = with_unit_batch(out);
  if (lse) call.lse = with_unit_batch(*lse);
  const VarlenArgs va(batch);
  check_sizes_not_negative(Arg{"q", f.q, kPackedDimNames + 1, 3});
  const int64_t sequences = va.check(f.q.shape[0], 128, f.q.shape[1], "q");
  std::vector<const Arg*> offsets;
  va.add_to(offsets);
  call.problem = check_forward_fp8(call.f, call.out, call.lse, options, sequences, offsets);
  call.problem.batch = sequences;
  call.seqs = device_sequences(batch, call.problem);
  return call;
}

VarlenCall validate_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const std::optional<TensorView>& lse,
                                   const VarlenBatch& batch, const ForwardOptions& options) {
  // a. ranks, as the caller's tensors have them
  check_packed_ranks({{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}}, "lse", lse ? &*lse : nullptr);
  VarlenCall call;
  call.q = with_unit_batch(q);
  call.k = with_unit_batch(k);
  call.v = with_unit_batch(v);
  call.out = with_unit_batch(out);
  if (lse) call.lse = with_unit_batch(*lse);
  const Arg aq{"q", call.q, kPackedDimNames, 4, 1}, ak{"k", call.k, kPackedDimNames, 4, 1},
      av{"v", call.v, kPackedDimNames, 4, 1}, aout{"out", call.out, kPackedDimNames, 4, 1};
  const TensorView no_lse;
  const Arg alse{"lse", lse ? *call.lse : no_lse, kPackedLseDimNames, 3, 1};
  const Operand operands[4] = {{aq, aq}, {ak, ak}, {av, ak, true}, {aout, aq, true}};

  // a to j on the (1, total, heads, head_dim) views (head dims up to 512, as the dense forward)
  ProblemSizes sizes = check_attention_tensors(operands, aq, ak, av, lse ? &alse : nullptr, false, kMaxForwardHeadDim);

  // k. softmax scale; p. window, softcap, sinks
  check_softmax_scale(options.softmax_scale);
  check_model_options(options, sizes, false);

  // o1 to o6: the offsets (and seqused_k); the forward's tiles are query blocks of 128 rows, 64
  // for the 512 kernel
  const VarlenArgs va(batch);
  const int64_t sequences = va.check(sizes.seqlen_q, sizes.kernel_dim() == 512 ? 64 : 128, sizes.heads_q, "q");

  // l, m. written tensors apart from everything the call reads or writes
  std::vector<const Arg*> tensors = {&aq, &ak, &av, &aout}, written = {&aout};
  va.add_to(tensors);
  const std::optional<Arg> asinks = sinks_arg(options);
  add_sinks_and_lse(tensors, written, asinks, lse ? &alse : nullptr);
  check_written_apart(tensors, written);

  sizes.batch = sequences;
  call.problem = forward_problem(sizes, q.dtype, options, lse.has_value());
  call.seqs = device_sequences(batch, sizes);
  return call;
}

// ---- KV caches (warpattn.hpp, KvCache): the rules a to m for q, out and lse with the caches
// as k and v (a paged cache's first axis is its pages, not the batch), then for the new keys
// and values with q, then the cache's own (rules c1 to c7 below), p, and the overlap rules
// over everything, the caches written when the call appends.
namespace {
const char* const kPagedDimNames[4] = {"num_pages", "page_size", "heads", "head_dim"};
const char* const kBlockTableDimNames[2] = {"batch", "max_pages"};
const char* const kCacheSeqlensDimNames[1] = {"batch"};
const char* const kDenseVtCacheDimNames[4] = {"batch", "heads", "seqlen / 16", "16 x head_dim"};
const char* const kPagedVtCacheDimNames[4] = {"num_pages", "heads", "page_size / 16", "16 x head_dim"};
const char* const kCacheDescaleDimNames[1] = {"heads_kv"};

// Whether a call's cache is E4M3 (KvCache::k_descale): either cache's dtype, or a descale given,
// says so; check_fp8_cache_tensors then requires all of it.
bool is_fp8_cache(const KvCache& c) {
  return c.k_cache.dtype == DType::e4m3 || c.v_cache.dtype == DType::e4m3 || c.k_descale || c.v_descale;
}

// Rules a to j for an E4M3 cache (warpattn.hpp, KvCache::k_descale): q and out 16-bit as
// forward()'s, the caches e4m3 (v_cache transposed in 16-key slices: (pages, Hkv, page keys /
// 16, 16 D)), the keys of a
// page (the dense cache's S_cache) a multiple of 16, the head dim one with an FP8 kernel, the
// descales (Hkv) fp32. Returns the call's sizes (seqlen_k: a page's keys, as
// check_attention_tensors').
ProblemSizes check_fp8_cache_tensors(const Arg& aq, const Arg& ak, const Arg& av, const Arg& aout, const Arg* alse,
                                     const Arg& aks, const Arg& avs, const KvCache& cache, bool paged) {
  const Arg* const tensors[4] = {&aq, &ak, &av, &aout};
  const Arg* const scales[2] = {&aks, &avs};
  if (!cache.k_descale || !cache.v_descale)
    fail(Message() << (cache.k_descale ? "v_descale" : "k_descale")
                   << ": an E4M3 cache needs both k_descale and v_descale ((heads_kv) float32), got "
                   << (cache.k_descale || cache.v_descale ? "one" : "neither"));
  for (const Arg* a : tensors) check_rank(*a);
  for (const Arg* a : scales) check_rank(*a);
  if (alse) check_rank(*alse);
  for (const Arg* a : tensors) check_sizes_not_negative(*a);
  for (const Arg* a : scales) check_sizes_not_negative(*a);
  if (alse) check_sizes_not_negative(*alse);
  for (const Arg* a : tensors) check_not_null(*a);
  for (const Arg* a : scales) check_not_null(*a);
  if (alse) check_not_null(*alse);
  check_16bit_dtype(aq);
  check_dtype(aout, aq.view.dtype, aq.name);
  check_dtype(ak, DType::e4m3);
  check_dtype(av, DType::e4m3);
  for (const Arg* a : scales) check_dtype(*a, DType::f32);
  if (alse) check_dtype(*alse, DType::f32);
  // (256: the lean producer's kernel, forward_config.hpp's KvCacheConfig)
  constexpr int kFp8CacheHeadDims[] = {64, 128, 256};
  check_head_dim_in(aq, kFp8CacheHeadDims, " for an E4M3 KV cache");
  const TensorView &q = aq.view, &k = ak.view;
  ProblemSizes sizes{q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  check_shape(aout, q.shape, "(same as q)");
  const int64_t k_want[4] = {paged ? k.shape[0] : sizes.batch, k.shape[1], k.shape[2], sizes.head_dim};
  check_shape(ak, k_want, paged ? "(head_dim as q)" : "(batch and head_dim as q)");
  if (k.shape[1] % 16 != 0)
    fail(Message() << "k_cache: " << (paged ? "page_size" : "seqlen") << " (shape[1]) must be a multiple of 16 for an "
                   << "E4M3 cache (Vᵀ's keys come in 16-key slices), got " << k.shape[1]);
  const int64_t v_want[4] = {k.shape[0], sizes.heads_kv, k.shape[1] / 16, 16 * sizes.head_dim};
  check_shape(av, v_want,
              paged ? "(k_cache's num_pages, heads, page_size / 16, 16 x head_dim: V transposed in 16-key slices)"
                    : "(k_cache's batch, heads, seqlen / 16, 16 x head_dim: V transposed in 16-key slices)");
  const int64_t heads_want[1] = {sizes.heads_kv};
  for (const Arg* a : scales) check_shape(*a, heads_want, "(one descale per KV head of k_cache)");
  if (alse) check_lse_shape(*alse, sizes);
  check_head_groups(sizes.heads_q, sizes.heads_kv, ak.name);
  for (const Arg* a : tensors) check_last_dim_contiguous(*a);
  for (const Arg* a : tensors) check_tma_layout(*a);
  // (a zero stride is allowed: one descale for every head)
  for (const Arg* a : scales)
    if (a->view.stride[0] < 0) fail(Message() << a->name << ": stride[0] (heads_kv) must not be negative, got "
                                              << a->view.stride[0]);
  for (const Arg* a : scales) check_fp32_layout(*a, 0);
  if (alse) check_fp32_layout(*alse, 3);
  check_coordinates_fit(aq);
  check_coordinates_fit(ak);
  check_coordinates_fit(av);
  return sizes;
}
}  // namespace

KvCacheCall validate_forward_kvcache(const TensorView& q, const KvCache& cache, const TensorView& out,
                                     const std::optional<TensorView>& lse, const ForwardOptions& options) {
  const bool paged = cache.block_table.has_value();
  const bool fp8 = is_fp8_cache(cache);
  const char* const* cache_dims = paged ? kPagedDimNames : kAttentionDimNames;
  const char* const* v_cache_dims = !fp8 ? cache_dims : paged ? kPagedVtCacheDimNames : kDenseVtCacheDimNames;
  const Arg aq{"q", q, kAttentionDimNames, 4};
  const Arg ak{"k_cache", cache.k_cache, cache_dims, 4};
  const Arg av{"v_cache", cache.v_cache, v_cache_dims, 4};
  const Arg aout{"out", out, kAttentionDimNames, 4};
  const TensorView none;
  const Arg alse{"lse", lse ? *lse : none, kLseDimNames, 3};
  const Arg aks{"k_descale", cache.k_descale ? *cache.k_descale : none, kCacheDescaleDimNames, 1};
  const Arg avs{"v_descale", cache.v_descale ? *cache.v_descale : none, kCacheDescaleDimNames, 1};
  const Operand operands[4] = {{aq, aq}, {ak, ak}, {av, ak, true}, {aout, aq, true}};

  // a to j: q, the caches, out, lse (head dims up to 512, as the dense forward; an E4M3 cache's
  // 64, 128 or 256, and its descales)
  ProblemSizes sizes = fp8 ? check_fp8_cache_tensors(aq, ak, av, aout, lse ? &alse : nullptr, aks, avs, cache, paged)
                           : check_attention_tensors(operands, aq, ak, av, lse ? &alse : nullptr, paged,
                                                     kMaxForwardHeadDim);

  // c1. the new keys and values: both or neither, then a to j with q, and the caches' heads
  // and v's head dim
  if (cache.k.has_value() != cache.v.has_value())
    fail(Message() << (cache.k ? "v" : "k") << ": the new keys and values come together, got " << (cache.k ? "k" : "v")
                   << " alone");
  const Arg aknew{"k", cache.k ? *cache.k : none, kAttentionDimNames, 4};
  const Arg avnew{"v", cache.v ? *cache.v : none, kAttentionDimNames, 4};
  int64_t appended = 0;
  if (cache.k) {
    const Operand fresh[3] = {{aq, aq}, {aknew, aknew}, {avnew, aknew, true}};
    check_attention_tensors(fresh, aq, aknew, avnew, nullptr, false, kMaxForwardHeadDim);
    const int64_t want_k[4] = {q.shape[0], cache.k->shape[1], cache.k_cache.shape[2], cache.k_cache.shape[3]};
    check_shape(aknew, want_k, "(batch as q, heads and head_dim as k_cache)");
    // (an E4M3 cache's v_cache is transposed: its heads and head dim are k_cache's)
    const int64_t want_v[4] = {q.shape[0], cache.k->shape[1], fp8 ? cache.k_cache.shape[2] : cache.v_cache.shape[2],
                               fp8 ? cache.k_cache.shape[3] : cache.v_cache.shape[3]};
    check_shape(avnew, want_v, "(batch as q, rows as k, heads and head_dim as v_cache)");
    appended = cache.k->shape[1];
    if (!cache.cache_seqlens)
      fail(Message() << "cache_seqlens: needed to append k and v (where each sequence's new rows go), got none");
  }

  // c2. the split count
  if (cache.num_splits < 0 || cache.num_splits > kMaxDecodeSplits)
    fail(Message() << "num_splits: expected 0 (chosen from the shape) or 1 to " << kMaxDecodeSplits << ", got "
                   << cache.num_splits);

  // c3. cache_seqlens: (batch) int32, contiguous
  const Arg aseqlens{"cache_seqlens", cache.cache_seqlens ? *cache.cache_seqlens : none, kCacheSeqlensDimNames, 1};
  if (cache.cache_seqlens) check_offsets_array(aseqlens, sizes.batch, "(batch, one per sequence of q)");

  // c4 to c6. block_table: (batch, max_pages) int32, last dimension contiguous, 4-byte aligned;
  // the pages: any size from 1 key; the capacity within 32-bit key indices
  const Arg atable{"block_table", paged ? *cache.block_table : none, kBlockTableDimNames, 2};
  int64_t capacity = sizes.seqlen_k;
  KvPages pages;
  if (paged) {
    check_rank(atable);
    check_sizes_not_negative(atable);
    check_dtype(atable, DType::s32);
    const int64_t want[2] = {sizes.batch, cache.block_table->shape[1]};
    check_shape(atable, want, "(batch as q, max_pages)");
    check_not_null(atable);
    check_last_dim_contiguous(atable);
    check_fp32_layout(atable, 1);
    const int64_t page_size = cache.k_cache.shape[1];
    if (page_size < 1)
      fail(Message() << "k_cache: page_size (shape[1]) must be at least 1 with block_table, got " << page_size);
    const int64_t max_pages = cache.block_table->shape[1];
    if (max_pages > 0 && cache.k_cache.shape[0] == 0)
      fail(Message() << "k_cache: a paged cache needs at least one page (num_pages, shape[0]) for block_table's "
                     << max_pages << " pages per sequence, got 0");
    // (page_size < 2^31 by rule j, so the product is taken once max_pages is as small)
    if (max_pages >= kCoordinateLimit || max_pages * page_size >= kCoordinateLimit)
      fail(Message() << "block_table: max_pages x page_size = " << max_pages << " x " << page_size
                     << " keys per sequence must be less than 2^31 (the kernel uses 32-bit key indices)");
    capacity = max_pages * page_size;
    pages.table = static_cast<const int*>(cache.block_table->data);
    pages.table_stride = cache.block_table->stride[0];
    pages.num_pages = static_cast<int>(cache.k_cache.shape[0]);
    pages.page_size = static_cast<int>(page_size);
  } else {
    pages.num_pages = static_cast<int>(sizes.batch);
  }

  // c7. the launch's tiles: one per block of positions of each sequence and chunk of packed
  // query heads (128-row tiles, 64 for the 512 kernel; decode_plan.hpp's gqa_packing)
  const GqaPacking packing = gqa_packing(static_cast<int>(sizes.heads_kv > 0 ? sizes.heads_q / sizes.heads_kv : 1),
                                         kvcache_block_m(sizes.kernel_dim()));
  const uint64_t tiles = saturating_mul(
      saturating_mul(static_cast<uint64_t>(sizes.batch),
                     static_cast<uint64_t>((sizes.seqlen_q + packing.positions - 1) / packing.positions)),
      static_cast<uint64_t>(sizes.heads_q / packing.heads));
  if (tiles >= static_cast<uint64_t>(kCoordinateLimit))
    fail(Message() << "q: batch x heads / " << packing.heads << " x ceil(seqlen_q / " << packing.positions
                   << ") = " << tiles << " work tiles must be less than 2^31 (the kernel uses 32-bit tile indices)");

  // k. softmax scale; p. window, softcap, sinks (the window's bound over the capacity)
  sizes.seqlen_k = capacity;
  check_softmax_scale(options.softmax_scale);
  check_model_options(options, sizes, fp8);

  // l, m. out and lse apart from everything; the caches too when they are appended to
  std::vector<const Arg*> tensors = {&aq, &ak, &av, &aout}, written = {&aout};
  if (fp8) {
    tensors.push_back(&aks);
    tensors.push_back(&avs);
  }
  if (cache.k) {
    tensors.push_back(&aknew);
    tensors.push_back(&avnew);
    written.push_back(&ak);
    written.push_back(&av);
  }
  if (cache.cache_seqlens) tensors.push_back(&aseqlens);
  if (paged) tensors.push_back(&atable);
  const std::optional<Arg> asinks = sinks_arg(options);
  add_sinks_and_lse(tensors, written, asinks, lse ? &alse : nullptr);
  check_written_apart(tensors, written);

  KvCacheCall call;
  call.problem = forward_problem(sizes, q.dtype, options, lse.has_value());
  call.pages = pages;
  call.appended = appended;
  call.num_splits = cache.num_splits;
  call.fp8 = fp8;
  call.work.cache_seqlens = cache.cache_seqlens ? static_cast<const int*>(cache.cache_seqlens->data) : nullptr;
  call.work.capacity = static_cast<int>(capacity);
  call.work.appended = static_cast<int>(std::min<int64_t>(appended, capacity));
  return call;
}

}  // namespace warpattn::detail
