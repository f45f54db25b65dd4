// What one CTA of the backward's main kernel does: key block n of one (batch, KV head), against
// query blocks [m_begin, m_end) of every query head of the KV head's group. Host-and-device
// code, so CPU tests can check the ranges against brute force.
#pragma once

#include "hopper/host_device.hpp"
#include "hopper/kv_tiles.hpp"

namespace warpattn::detail {

struct QueryBlockRange {
  int begin = 0, end = 0;
};

// The query blocks with a row that sees some key of key block n, for the band of keys each row
// sees (kv_tiles.hpp: causal, a sliding window, or neither). Both of a row's bounds are
// non-decreasing in the row, so the rows that see the block are those whose end passes the
// block's first key and whose beginning does not pass its last: one interval. Empty: begin ==
// end. (Causal alone: the first row to see key n·block_n is n·block_n + seqlen_q − seqlen_k.)
WARPATTN_HOST_DEVICE QueryBlockRange query_block_range(int n, int block_n, int block_m, int seqlen_q, int seqlen_k,
                                                       const KeyBand& band) {
  const int m_blocks = ceil_div(seqlen_q, block_m);
  const int first_key = n * block_n;
  const int last_key = ((n + 1) * block_n < seqlen_k ? (n + 1) * block_n : seqlen_k) - 1;
  const int offset = seqlen_k - seqlen_q;  // row i's diagonal is key i + offset
  // The first row whose band reaches first_key (row + offset + right >= first_key) and the last
  // whose band starts at or before last_key (row + offset - left <= last_key).
  int first_row = 0, last_row = seqlen_q - 1;
  if (band.right != kUnbounded) first_row = first_key - offset - band.right > 0 ? first_key - offset - band.right : 0;
  if (band.left != kUnbounded && last_key - offset + band.left < last_row) last_row = last_key - offset + band.left;
  if (last_key < first_key || last_row < first_row) return {m_blocks, m_blocks};
  return {first_row / block_m, last_row / block_m + 1};
}
WARPATTN_HOST_DEVICE QueryBlockRange query_block_range(int n, int block_n, int block_m, int seqlen_q, int seqlen_k,
                                                       bool causal) {
  return query_block_range(n, block_n, block_m, seqlen_q, seqlen_k, causal_band(causal));
}

// The last key block with a key visible to some row of query block m (one that has such a key).
WARPATTN_HOST_DEVICE int last_key_block(int m, int block_m, int block_n, int seqlen_q, int seqlen_k,
                                        const KeyBand& band) {
  return kv_tile_range(m, block_m, block_n, seqlen_q, seqlen_k, band).end - 1;
}
WARPATTN_HOST_DEVICE int last_key_block(int m, int block_m, int block_n, int seqlen_q, int seqlen_k, bool causal) {
  return last_key_block(m, block_m, block_n, seqlen_q, seqlen_k, causal_band(causal));
}

// Deterministic mode: the key blocks add their dQ to query block m one at a time, this one
// after `dq_turn` others. Without a band in ascending order (all start at query block 0 and
// walk up together); with one (the banded kernels: causal or a window) in descending order:
// the key blocks that reach query block m are an interval ending at last_key_block(m), those
// after n in it go first, and key block n's first query block is one no later key block
// needs to wait on before n; the kernel launches the key blocks last-first so that those a CTA
// waits for were launched before it.
WARPATTN_HOST_DEVICE int dq_turn(int n, int m, int block_m, int block_n, int seqlen_q, int seqlen_k, bool banded,
                                 const KeyBand& band) {
  return banded ? last_key_block(m, block_m, block_n, seqlen_q, seqlen_k, band) - n : n;
}
WARPATTN_HOST_DEVICE int dq_turn(int n, int m, int block_m, int block_n, int seqlen_q, int seqlen_k, bool causal) {
  return dq_turn(n, m, block_m, block_n, seqlen_q, seqlen_k, causal, causal_band(causal));
}

// The banded kernels' launch order (not the deterministic one): with the key block first in
// the grid, the CTAs that start last under a causal mask include each (batch, KV head)'s key
// block 0, the longest, so the SMs idle at the end while they finish (a list-scheduling model
// of d = 256 at 4K tokens, 132 SMs: 7% over the ideal; d = 128: 6%). Longest first over all
// (batch, KV head) rows would leave only short blocks at the end, but then the running CTAs
// would read every row's Q, dO and dQ accumulator at once, far more than the L2 holds. So the
// rows are cut into `groups` groups of nearly equal size (group i: rows [rows·i/groups,
// rows·(i+1)/groups)), each small enough for the L2, taken one after another, and within a
// group the key block is outer and the row inner (key block 0 of every row first). The model:
// 0.5-1.2% over the ideal at 4K. row = head_kv + heads_kv · batch.
struct KeyBlockOrder {
  int n_block, row;
};
WARPATTN_HOST_DEVICE KeyBlockOrder grouped_longest_first(int tile, int n_blocks, int rows, int groups) {
  const auto group_start = [&](int i) { return static_cast<int>(static_cast<int64_t>(rows) * i / groups); };
  // An estimate that is the group or the one before it (tile / n_blocks lies between the group's
  // first and next rows); then corrected.
  int i = static_cast<int>(static_cast<int64_t>(tile) * groups / (static_cast<int64_t>(n_blocks) * rows));
  while (i + 1 < groups && static_cast<int64_t>(n_blocks) * group_start(i + 1) <= tile) ++i;
  while (i > 0 && static_cast<int64_t>(n_blocks) * group_start(i) > tile) --i;
  const int first = group_start(i), size = group_start(i + 1) - first;
  const int local = tile - n_blocks * first;
  return {local / size, first + local % size};
}

// How many groups for grouped_longest_first: the fewest whose rows' Q, dO (16-bit) and dQ
// accumulator (fp32) fit `l2_bytes`; per row, every query head of the KV head's group. At least 1.
inline int longest_first_groups(int rows, int kv_group, int seqlen_q, int head_dim, int64_t l2_bytes) {
  const int64_t row_bytes = static_cast<int64_t>(kv_group) * seqlen_q * head_dim * (2 + 2 + 4);
  const int64_t rows_per_group = row_bytes > 0 && l2_bytes >= row_bytes ? l2_bytes / row_bytes : 1;
  const int64_t groups = (rows + rows_per_group - 1) / rows_per_group;
  return groups < 1 ? 1 : static_cast<int>(groups);
}

struct KeyBlockWork {
  int n_block, head_kv;
  int batch;  // of the tensors' batch dimension (and the TMA maps'); a packed batch's: 0
  QueryBlockRange m;
  int group;  // query heads per KV head
  // The sequence: its lengths, its first query row and key in the tensors (a packed batch's
  // offsets; 0 otherwise), and its first row in the workspace's per-head rows
  // (backward/workspace.hpp: head h's rows start h x BackwardParams::rows later).
  int seqlen_q, seqlen_k, q_offset, k_offset;
  int64_t ws_row0;
  // The key block's steps: (query head, query block) pairs, heads outer.
  WARPATTN_HOST_DEVICE int all_steps() const { return group * (m.end - m.begin); }
  // This CTA's of them, [step_begin, step_end): all, or a cut tile's part (tail_split.hpp; then
  // `part` >= 0 and `cut_tile` its index among the cut tiles). The producer, the consumers and
  // the dQ writer count this CTA's steps from 0; head() and m_block() take that count.
  int step_begin = 0, step_end = 0;
  int part = -1, cut_tile = 0;
  WARPATTN_HOST_DEVICE void take_steps(int begin, int end) { step_begin = begin, step_end = end; }
  WARPATTN_HOST_DEVICE int steps() const { return step_end - step_begin; }
  // The walk's order, the kernel's compile-time choice: m_block<Cfg> reads Cfg::kRotated and
  // Cfg::kWalkDown (backward_config.hpp; docs/backward-design.md, "The walk's order"). Rotated:
  // each head's walk starts `rotation` query blocks into its range (walk_rotation) and wraps past
  // the last to the first, so the key blocks running together need not be on the same query
  // block; a cut tile's parts and every query head still take each pair once (the rotation
  // permutes a head's blocks). kWalkDown: the (rotated) walk taken from the range's other end,
  // last to first.
  int rotation = 0;
  WARPATTN_HOST_DEVICE int head(int step) const {
    return head_kv * group + (step_begin + step) / (m.end - m.begin);
  }
  template <class Cfg>
  WARPATTN_HOST_DEVICE int m_block(int step) const {
    const int span = m.end - m.begin;
    int index = (step_begin + step) % span;  // the step's place in its head's walk
    if constexpr (Cfg::kRotated) index = index + rotation < span ? index + rotation : index + rotation - span;
    if constexpr (Cfg::kWalkDown) return m.end - 1 - index;
    return m.begin + index;
  }
};

// How far key block n of `n_blocks` rotates a walk of `span` query blocks (KeyBlockWork::rotation):
// mode 1, n blocks on, so the key blocks that run together add their dQ into different query
// blocks instead of into the same one; mode 2, n·span / n_blocks on, spread over the whole walk.
// 0: not rotated (mode 0, or no steps). Under a causal mask too: there the CTAs of a row that a
// launch starts as the row before it ends each start at their diagonal as it passes, so their
// ascending walks run in step on one query block (scripts/walk_order_l2_model.py: 16.5 CTAs on
// a block at 16K tokens, 1.4 rotated).
WARPATTN_HOST_DEVICE int walk_rotation(int n, int n_blocks, int span, int mode) {
  if (span <= 0 || n_blocks <= 0 || mode <= 0) return 0;
  if (mode == 1) return n % span;
  return static_cast<int>(static_cast<int64_t>(n) * span / n_blocks % span);
}

}  // namespace warpattn::detail
