// Shared memory of the backward's main kernel. K and V once per CTA; Q (+ its rows' LSE) and
// dO (+ D) in a ring; dS in two buffers (the next step's dS is written while the dQ GEMMs of
// this one may still read); one dQ piece per consumer for the bulk reduce (unless dQ is added
// from registers). Tiles are stacks of 128-byte panels, 128B-swizzled and 1024-byte aligned
// (see ../shared_storage.cuh).
#pragma once
#include <cstdint>

namespace warpattn::detail {

// P (stored as Pᵀ) of the d = 256 kernel's 80-key tile (Cfg::kBlockN80), one buffer per dO
// stage: its only reader, the dV GEMM, is also dO's last, so a consumer that has waited for a
// dO slot's next load knows both consumers' dV GEMMs of the slot's previous step have completed
// (their do_empty arrivals), and may write the slot's P again. The other head dims keep P in
// registers: an empty base, no bytes.
template <class Cfg, bool = (Cfg::kPtTileBytes > 0)>
struct BackwardPtStorage {};
template <class Cfg>
struct BackwardPtStorage<Cfg, true> {
  alignas(1024) uint8_t pt[Cfg::kDoStages][Cfg::kPtTileBytes];
};

// One dQ piece per consumer for its writer warp's bulk reduce; none where the consumers add dQ
// from their registers (Cfg::kDqFromRegisters).
template <class Cfg, bool = !Cfg::kDqFromRegisters>
struct BackwardDqPieceStorage {};
template <class Cfg>
struct BackwardDqPieceStorage<Cfg, true> {
  alignas(1024) float dq_piece[Cfg::kConsumerWarpgroups][Cfg::kDqPieceFloats];
};

template <class Cfg>
struct BackwardSharedStorage : BackwardPtStorage<Cfg>, BackwardDqPieceStorage<Cfg> {
  alignas(1024) uint8_t k[Cfg::kKTileBytes];
  alignas(1024) uint8_t v[Cfg::kKTileBytes];
  alignas(1024) uint8_t q[Cfg::kQStages][Cfg::kQTileBytes];
  alignas(1024) uint8_t dout[Cfg::kDoStages][Cfg::kQTileBytes];
  alignas(1024) uint8_t ds[2][Cfg::kDsTileBytes];
  alignas(16) float lse_log2[Cfg::kQStages][Cfg::kBlockM];
  alignas(16) float row_d[Cfg::kDoStages][Cfg::kBlockM];
  alignas(8) uint64_t kv_full;
  uint64_t q_full[Cfg::kQStages];
  uint64_t q_empty[Cfg::kQStages];  // both consumers' dK GEMM (Q's last reader) has completed
  uint64_t do_full[Cfg::kDoStages];
  uint64_t do_empty[Cfg::kDoStages];  // both consumers' dV GEMM (dO's last reader) has completed
  int tail_ticket;                    // a cut tile's part: its ticket (tail_fixup.cuh)
};

// Named barriers of the backward (0 is __syncthreads).
struct BackwardBarrier {
  static constexpr int kDsWritten = 1;  // both consumers' dS halves are in shared memory (256; not lagged)
  // Consumer i and its dQ writer warp (128 + 32 threads): the piece buffer holds a new piece
  // (kDqFull0 + i), and the writer's bulk reduce has read it (kDqEmpty0 + i).
  static constexpr int kDqFull0 = 2;
  static constexpr int kDqEmpty0 = 4;
  static constexpr int kDqThreads = 128 + 32;
  // Lagged dQ (Cfg::kLaggedDq) instead of kDsWritten, 256 threads each, consumer c arriving and
  // the other syncing: c's half of dS buffer b is written (kDsHalfWritten + 2c + b), c's dQ GEMM
  // has read buffer b (kDsBufferRead + 2c + b); consumer 0's first softmax is done
  // (kStaggeredStart, Cfg::kStaggeredStart).
  static constexpr int kDsHalfWritten = 6;
  static constexpr int kDsBufferRead = 10;
  static constexpr int kStaggeredStart = 14;
  // The consumers of a cut tile's part (256 threads): its ticket is taken; its partials are
  // stored, or the others' may be read (tail_fixup.cuh).
  static constexpr int kTailFixup = 15;
};

}  // namespace warpattn::detail
