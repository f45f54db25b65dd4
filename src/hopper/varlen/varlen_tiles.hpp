// Work tiles of a packed variable-length batch: what each sequence contributes and where each
// tile of the persistent grid's order comes from. Host-and-device functions, so the CPU tests
// check the plan against a model of their own (tests/cpu/test_varlen_tiles.cpp).
//
// The plan (plan_varlen.cu) orders the sequences by their longest tile's work, descending
// (longest processing time first: long tiles start early, short ones fill the tail), and lays
// each sequence's tiles out in the dense order (tile_order.hpp: chunks of heads whose K and V
// fit in L2, last query blocks first), one sequence after another. Each tile is then one entry
// of a table the producer reads with two 16-byte loads: no division or search on its path.
#pragma once

#include "hopper/backward/key_block_work.hpp"
#include "hopper/host_device.hpp"
#include "hopper/kv_tiles.hpp"
#include "hopper/tile_order.hpp"

namespace warpattn::detail {

// One work tile of a packed batch as the producer reads it (32 bytes, two int4 loads). The
// forward's tiles are query blocks (block: m_block, head: the query head, n_tiles: key tiles to
// visit); the backward's are key blocks (block: n_block, head: the KV head, n_tiles: query
// blocks to visit).
struct alignas(16) VarlenTile {
  int block, head, batch, n_tiles;  // batch: the sequence
  int q_offset, seqlen_q, k_offset, seqlen_k;
};
static_assert(sizeof(VarlenTile) == 32, "two int4 loads");

// Where one sequence's rows are in the packed tensors.
struct SequenceSpan {
  int q_offset, seqlen_q, k_offset, seqlen_k;
};

// The offsets and lengths of a packed batch, in device memory.
struct VarlenSequences {
  const int* cu_seqlens_q = nullptr;  // batch + 1
  const int* cu_seqlens_k = nullptr;  // batch + 1
  const int* seqused_k = nullptr;     // batch, or null
  int batch = 0, total_q = 0, total_k = 0;
  // The caller's max_seqlen_q (FlashAttention's argument), a hint for the host's choice of tile
  // shape only: nothing depends on it being right but speed.
  long long max_seqlen_q = 0;
};

WARPATTN_HOST_DEVICE int clamp_int(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Sequence b's rows, clamped to the packed tensors whatever the offsets hold: offsets that break
// the rules (decreasing, past the end) give wrong sequences, never rows outside the tensors.
WARPATTN_HOST_DEVICE SequenceSpan sequence_span(const VarlenSequences& s, int b) {
  SequenceSpan r;
  r.q_offset = clamp_int(s.cu_seqlens_q[b], 0, s.total_q);
  r.seqlen_q = clamp_int(s.cu_seqlens_q[b + 1], r.q_offset, s.total_q) - r.q_offset;
  r.k_offset = clamp_int(s.cu_seqlens_k[b], 0, s.total_k);
  r.seqlen_k = clamp_int(s.cu_seqlens_k[b + 1], r.k_offset, s.total_k) - r.k_offset;
  if (s.seqused_k != nullptr) r.seqlen_k = clamp_int(s.seqused_k[b], 0, s.total_k - r.k_offset);
  return r;
}

// The tile shape and the launch facts the plan needs.
struct VarlenGeometry {
  int block_m = 128, block_n = 128, heads_q = 1, kv_group = 1;
  bool causal = false;
  // The backward's plan: tiles are key blocks of block_n keys of each KV head, in ascending
  // order within a (sequence, KV head), or descending with reverse_key_blocks (the deterministic
  // causal order, key_block_work.hpp's dq_turn: a key block's dQ turns wait only for blocks
  // earlier in the table, hence launched before it).
  bool key_blocks = false, reverse_key_blocks = false;
  // The forward's keys per row (kv_tiles.hpp): causal's band, or a sliding window's.
  KeyBand band;
  long long kv_bytes_per_key = 0;  // K and V of one key of one KV head: 2 x head_dim x element bytes
  long long l2_bytes = 0;
  int multiprocessors = 1;
};

// The tile shape and heads of a launch (the rest as their defaults, to be set where needed).
WARPATTN_HOST_DEVICE VarlenGeometry varlen_geometry(int block_m, int block_n, int heads_q, int kv_group, bool causal) {
  VarlenGeometry g;
  g.block_m = block_m, g.block_n = block_n, g.heads_q = heads_q, g.kv_group = kv_group, g.causal = causal;
  g.band = causal_band(causal);
  return g;
}

// Tiles of one sequence: its query blocks times the query heads (the backward's: its key blocks
// times the KV heads).
WARPATTN_HOST_DEVICE long long sequence_tiles(const SequenceSpan& s, const VarlenGeometry& g) {
  if (g.key_blocks) return static_cast<long long>(ceil_div(s.seqlen_k, g.block_n)) * (g.heads_q / g.kv_group);
  return static_cast<long long>(ceil_div(s.seqlen_q, g.block_m)) * g.heads_q;
}

// The work of a sequence's longest tile, the plan's sort key: the key tiles of its last query
// block (under a sliding window about every block's; the backward's: the query blocks of its
// first key block).
WARPATTN_HOST_DEVICE int sequence_work(const SequenceSpan& s, const VarlenGeometry& g) {
  if (g.key_blocks) {
    if (s.seqlen_k == 0) return 0;
    const QueryBlockRange r = query_block_range(0, g.block_n, g.block_m, s.seqlen_q, s.seqlen_k, g.band);
    return r.end - r.begin;
  }
  if (s.seqlen_q == 0) return 0;
  return kv_tile_range(ceil_div(s.seqlen_q, g.block_m) - 1, g.block_m, g.block_n, s.seqlen_q, s.seqlen_k, g.band).count();
}

// The sequence's tiles as the dense order lays out one batch entry.
WARPATTN_HOST_DEVICE TileGrid sequence_grid(const SequenceSpan& s, const VarlenGeometry& g) {
  const int m_blocks = ceil_div(s.seqlen_q, g.block_m);
  const long long kv_bytes = g.kv_bytes_per_key * s.seqlen_k / g.kv_group;
  return {m_blocks, g.heads_q, 1, chunk_heads_for(kv_bytes, m_blocks > 0 ? m_blocks : 1, g.heads_q, g.l2_bytes, g.multiprocessors)};
}

// Tile t (0 <= t < sequence_tiles) of sequence b.
WARPATTN_HOST_DEVICE VarlenTile varlen_tile(const SequenceSpan& s, int b, int t, const VarlenGeometry& g) {
  if (g.key_blocks) {  // key blocks fastest, as the dense backward's grid
    const int n_blocks = ceil_div(s.seqlen_k, g.block_n);
    const int n = g.reverse_key_blocks ? n_blocks - 1 - t % n_blocks : t % n_blocks;
    const QueryBlockRange r = query_block_range(n, g.block_n, g.block_m, s.seqlen_q, s.seqlen_k, g.band);
    return {n, t / n_blocks, b, r.end - r.begin, s.q_offset, s.seqlen_q, s.k_offset, s.seqlen_k};
  }
  const WorkTile w = tile_coords(t, sequence_grid(s, g));
  const int n = kv_tile_range(w.m_block, g.block_m, g.block_n, s.seqlen_q, s.seqlen_k, g.band).count();
  return {w.m_block, w.head, b, n, s.q_offset, s.seqlen_q, s.k_offset, s.seqlen_k};
}

// The sort key of sequence b: work descending, then b ascending (a deterministic order).
WARPATTN_HOST_DEVICE unsigned long long plan_key(int work, int b) {
  return (static_cast<unsigned long long>(0x7fffffff - work) << 32) | static_cast<unsigned>(b);
}

// Upper bound on the tiles of a packed batch whose offsets keep the rules: sum over sequences
// of ceil(seqlen / block) <= total / block + batch (the forward: query rows, blocks of block_m,
// query heads; the backward: keys, blocks of block_n, KV heads). The table has this many entries;
// a batch with broken offsets that would need more keeps only its first (wrong, never outside).
WARPATTN_HOST_DEVICE long long max_varlen_tiles(long long total, long long batch, int block, int heads) {
  return (total / block + batch) * heads;
}

}  // namespace warpattn::detail
