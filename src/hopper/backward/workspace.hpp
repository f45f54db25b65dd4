// The backward's workspace: what its three launches pass to one another, in one allocation.
//   dq_accum  fp32 [B][Hq][rows][D]   dQ's partial sums (the main kernel adds, postprocess reads)
//   row_d     fp32 [B][Hq][rows]      D = rowsum(dO ∘ O) per query row (preprocess)
//   lse_log2  fp32 [B][Hq][rows]      LSE · log2(e); +inf for rows without keys (preprocess)
//   turns     int32 [B][Hq][rows/T]   deterministic mode: whose turn it is to add into a dQ block
//                                     (T = backward_turn_rows: 64, or 32 at d = 512)
//   sink_sums fp32 [Hq][B][rows/64]  with sinks: each 64-row block's part of its head's dsink
// rows = seqlen_q rounded up to the granule G (backward_block_m.hpp: 128, or 320 at d = 128 with
// an 80-row query block), so every query block of the kernels is whole and the bulk copies and
// reductions need no row predicates. Each region starts 256-byte aligned.
//
// A packed batch (varlen) has one "batch" of varlen_padded_rows rows per head, in which sequence
// b's rows start at varlen_row0 (FlashAttention-3's padding: every sequence starts a G-row
// block, so no block of the kernels spans two sequences, and the sequences' padded ranges never
// overlap: row0(b + 1) >= row0(b) + G x (floor(seqlen_q(b) / G) + 1), a multiple of G past the
// sequence's last row). The forward's FP8 paths use the same padding with G = 128.
#pragma once
#include <cstdint>

#include "hopper/backward/backward_block_m.hpp"
#include "hopper/host_device.hpp"
#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

// q_offset: the sequence's first row in the packed tensors (clamped to [0, total_q]).
// kGranule: backward_row_granule of the kernel's head dim (128 unless a knob says otherwise).
template <int kGranule = 128>
WARPATTN_HOST_DEVICE int64_t varlen_row0(int q_offset, int b) {
  return (int64_t(q_offset) + int64_t(b) * kGranule) / kGranule * kGranule;
}
WARPATTN_HOST_DEVICE int64_t varlen_padded_rows(int64_t total_q, int64_t batch, int64_t granule = 128) {
  return (total_q + batch * granule + granule - 1) / granule * granule;
}

// The sequence whose padded rows start at or before padded row `row`: the last b with
// varlen_row0(cu[b] clamped to [0, total], b) <= row (which does not decrease for offsets that
// keep the rules; for others, any answer keeps the callers' accesses inside). Sequence b's rows
// then hold padded rows varlen_row0(b) .. + its length; past that, up to the next sequence's, a
// gap that belongs to none.
template <int kGranule = 128>
WARPATTN_HOST_DEVICE int sequence_of_padded_row(const int* cu, int sequences, int total, int64_t row) {
  const auto offset = [&](int b) { return cu[b] < 0 ? 0 : (cu[b] > total ? total : cu[b]); };
  int lo = 0, hi = sequences - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (varlen_row0<kGranule>(offset(mid), mid) <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

struct BackwardWorkspaceLayout {
  static constexpr int64_t kRowAlign = 128;  // the default granule (backward_row_granule)
  // One turn counter per 64 query rows: as many as the 64-row blocks, more than an 80-row
  // kernel uses (its counter for block m is (its first row) / 80: below rows / 64 too). The
  // sinks' parts are per 64 rows at every head dim; the turns per backward_turn_rows (32 at
  // d = 512).
  static constexpr int64_t kTurnRows = 64;
  int64_t rows = 0;
  int64_t dq_accum = 0, row_d = 0, lse_log2 = 0, turns = 0, sink_sums = 0;  // byte offsets
  int64_t bytes = 0;                                                      // total

  BackwardWorkspaceLayout(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t head_dim, bool deterministic,
                          bool sinks = false) {
    const auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
    const int kernel_dim = forward_kernel_head_dim(head_dim);  // 64, 128, 256 or 512
    const int64_t granule = backward_row_granule(kernel_dim);
    rows = (seqlen_q + granule - 1) / granule * granule;
    const int64_t row_count = batch * heads_q * rows;
    dq_accum = 0;
    // dQ's accumulator has the kernel's columns (64, 128, 256 or 512: a head dim between is padded)
    row_d = align(dq_accum + row_count * kernel_dim * 4);
    lse_log2 = align(row_d + row_count * 4);
    turns = align(lse_log2 + row_count * 4);
    sink_sums = align(turns + (deterministic ? row_count / backward_turn_rows(kernel_dim) * 4 : 0));
    bytes = align(sink_sums + (sinks ? row_count / kTurnRows * 4 : 0));
  }
};

}  // namespace warpattn::detail
