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

struct KeyBlockWork {
  int n_block, head_kv, batch;
  QueryBlockRange m;
  int group;  // query heads per KV head
  // Steps: (query head, query block) pairs, heads outer.
  WARPATTN_HOST_DEVICE int steps() const { return group * (m.end - m.begin); }
  WARPATTN_HOST_DEVICE int head(int step) const { return head_kv * group + step / (m.end - m.begin); }
  WARPATTN_HOST_DEVICE int m_block(int step) const { return m.begin + step % (m.end - m.begin); }
};

}  // namespace warpattn::detail
