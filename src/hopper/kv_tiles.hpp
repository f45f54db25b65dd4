// Which key/value tiles a block of query rows visits, and which of them need a mask.
// Host-and-device functions so the CPU tests check them against brute force.
#pragma once

#include "hopper/host_device.hpp"

namespace warpattn::detail {

WARPATTN_HOST_DEVICE int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Number of key tiles [0, count) that hold at least one key visible to some row of query
// block `m_block`. Causal attention is aligned bottom-right: query i sees key j iff
// j <= i + seqlen_k - seqlen_q, so the block's last row bounds the last visible key; a block
// whose rows all precede the first key gets 0 (its rows have no key: O = 0, LSE = -inf).
WARPATTN_HOST_DEVICE int kv_tile_count(int m_block, int block_m, int block_n, int seqlen_q,
                                       int seqlen_k, bool causal) {
  const int all_tiles = ceil_div(seqlen_k, block_n);
  if (!causal) return all_tiles;
  const int last_row = (m_block + 1) * block_m < seqlen_q ? (m_block + 1) * block_m - 1 : seqlen_q - 1;
  const int last_key = last_row + seqlen_k - seqlen_q;
  if (last_key < 0) return 0;
  const int tiles = last_key / block_n + 1;
  return tiles < all_tiles ? tiles : all_tiles;
}

// True when some score of key tile n, for some row of the block starting at row m_start, must
// be masked: keys past seqlen_k (TMA fills them with zeros, which are not -inf), or keys
// above the causal diagonal. Tiles are visited from the last down, so these come first.
WARPATTN_HOST_DEVICE bool kv_tile_needs_mask(int n, int block_n, int m_start, int seqlen_q,
                                             int seqlen_k, bool causal) {
  const int last_key = (n + 1) * block_n - 1;
  if (last_key >= seqlen_k) return true;
  return causal && last_key > m_start + seqlen_k - seqlen_q;
}

// Rows that see fewer keys than this get P in two 16-bit parts (run_precise): an output row
// averaging k keys carries P's rounding error (bf16: 2^-9 relative, uniform) as about
// 2^-9 / sqrt(3) * |v| / sqrt(k_eff), where k_eff ~ k / e for N(0, 1) scores. From 128 keys on,
// with |v| up to 4.5 that is ~7e-4, half the 1.5e-3 elementwise bound FlashAttention-3 is held
// to (the 64K causal test checks rows just above the limit). 256 put half of the query blocks
// at N = 512 causal on the slower path.
inline constexpr int kPreciseKeyLimit = 128;

// True when the first row of the query block starting at m_start sees fewer keys than
// kPreciseKeyLimit (the block's other rows see at least as many).
WARPATTN_HOST_DEVICE bool sees_few_keys(int m_start, int seqlen_q, int seqlen_k, bool causal) {
  const int keys = causal ? m_start + seqlen_k - seqlen_q + 1 : seqlen_k;
  return keys < kPreciseKeyLimit;
}

}  // namespace warpattn::detail
