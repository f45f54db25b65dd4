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

// The query blocks with a row that sees some key of key block n. Causal attention is aligned
// bottom-right (query i sees key j iff j <= i + seqlen_k - seqlen_q): the first row to see key
// n·block_n is n·block_n + seqlen_q − seqlen_k, and every later row sees it too.
WARPATTN_HOST_DEVICE QueryBlockRange query_block_range(int n, int block_n, int block_m, int seqlen_q, int seqlen_k,
                                                       bool causal) {
  QueryBlockRange r;
  r.end = ceil_div(seqlen_q, block_m);
  if (causal) {
    const int first_row = n * block_n + seqlen_q - seqlen_k;
    r.begin = first_row > 0 ? first_row / block_m : 0;
    if (r.begin > r.end) r.begin = r.end;
  }
  return r;
}

// The last key block with a key visible to some row of query block m (one that has rows:
// m < ceil(seqlen_q / block_m), and under the causal mask m >= query_block_range(0).begin).
WARPATTN_HOST_DEVICE int last_key_block(int m, int block_m, int block_n, int seqlen_q, int seqlen_k, bool causal) {
  const int last = ceil_div(seqlen_k, block_n) - 1;
  if (!causal) return last;
  const int last_row = ((m + 1) * block_m < seqlen_q ? (m + 1) * block_m : seqlen_q) - 1;
  const int n = (last_row + seqlen_k - seqlen_q) / block_n;
  return n < last ? n : last;
}

// Deterministic mode: the key blocks add their dQ to query block m one at a time, this one
// after `dq_turn` others. Without a mask in ascending order (all start at query block 0 and
// walk up together); under the causal mask in descending order, from the diagonal: key block
// n's first query block is one no later key block reaches, so it starts without waiting, and
// the kernel launches the key blocks last-first so that those a CTA waits for were launched
// before it.
WARPATTN_HOST_DEVICE int dq_turn(int n, int m, int block_m, int block_n, int seqlen_q, int seqlen_k, bool causal) {
  return causal ? last_key_block(m, block_m, block_n, seqlen_q, seqlen_k, true) - n : n;
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
  // Steps: (query head, query block) pairs, heads outer.
  WARPATTN_HOST_DEVICE int steps() const { return group * (m.end - m.begin); }
  WARPATTN_HOST_DEVICE int head(int step) const { return head_kv * group + step / (m.end - m.begin); }
  WARPATTN_HOST_DEVICE int m_block(int step) const { return m.begin + step % (m.end - m.begin); }
};

}  // namespace warpattn::detail
