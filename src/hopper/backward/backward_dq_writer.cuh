// A dQ writer warp of the producer warpgroup: for each step, waits for its consumer's dQ piece
// in shared memory and adds it to the fp32 accumulator in global memory with one bulk reduce
// (cp.reduce.async.bulk .add.f32), then frees the buffer once the reduce has read it. The
// consumer's threads never wait on global memory.
//
// Deterministic mode: the key blocks add to a 64-row block of dQ in a fixed order (dq_turn in
// key_block_work.hpp). The writer waits until the block's turn counter shows every earlier key
// block's pieces (kD / 64 per key block; kD / 32 with 32-column pieces) as landed, adds, frees
// the buffer once the reduce has read it, then waits for its own add to land in global memory
// (wait_group 0) and counts itself in with a release: the next key block's turn waits for the
// landing, the consumer's next piece only for the read.
// Transposed dQ (80-row query blocks, Cfg::kDqTransposed): the consumer's piece is the 80 rows
// of its 64 columns (dq_transposed_layout.hpp), and the turn counter is per 80-row block: the
// one at (the block's first row) / 80 of the 64-row blocks' counters (all zeroed, more of them).
// d = 512 (32-row query blocks, transposed): a consumer's two pieces are its 128 columns, and a
// 32-row block has its own counter (the workspace keeps rows / 32 of them there:
// backward_turn_rows). Both CTAs of a key block wait for the same turn and count 4 pieces each
// in; their columns are disjoint, so only the order across key blocks is fixed, which is all that
// a column's sum depends on.
#pragma once

#include "hopper/backward/backward_params.hpp"
#include "hopper/backward/backward_shared_storage.cuh"
#include "hopper/backward/column_half.cuh"
#include "hopper/backward/dq_accum.cuh"
#include "hopper/backward/key_block_work.hpp"
#include "hopper/ptx/memory_order.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"

namespace warpattn::detail {

// The 64-row block of the step's queries that consumer `consumer`'s untransposed pieces cover
// (at kM = 128 each consumer has its own half of the rows).
template <class Cfg>
__device__ __forceinline__ int dq_row_block(const KeyBlockWork& work, int step, int consumer) {
  constexpr int kM = Cfg::kBlockM;
  return work.m_block<Cfg>(step) * kM / 64 + (kM == 128 ? consumer : 0);
}

// Where consumer `consumer`'s dQ piece `piece` of `step` starts in the fp32 accumulator: at kM =
// 64 pieces kPieces·consumer.. (64 columns each) of the step's 64 rows; at kM = 128 all columns
// of rows 64·consumer.. of its 128; transposed, the consumer's 64 columns of all kM rows.
template <class Cfg>
__device__ __forceinline__ float* dq_piece_destination(const BackwardParams& p, const KeyBlockWork& work, int step,
                                                       int piece, int consumer) {
  constexpr int kM = Cfg::kBlockM, kD = Cfg::kHeadDim;
  const int head = work.head(step);
  if constexpr (Cfg::kDqTransposed) {
    // the 64-column piece: the consumer's (d = 128), or piece `piece` of its columns (d = 512)
    const int column_piece = Cfg::kSplitHeadDim ? consumer_column0<Cfg>(consumer) / 64 + piece : consumer;
    return p.dq_accum +
           DqAccumLayout::transposed_piece_offset<kM>(p, work.ws_row0, head, work.m_block<Cfg>(step), column_piece, kD);
  }
  const int row_block = dq_row_block<Cfg>(work, step, consumer);
  if constexpr (Cfg::kBlockN80) {
    // 32-column pieces: piece `piece` of the consumer's kKVColumns is half (column0 % 64) / 32
    // of the 64 x 64 piece column0 / 64 (its registers' floats, the first or second 2048)
    const int column0 = Cfg::kKVColumns * consumer + Cfg::kDqPieceColumns * piece;
    return p.dq_accum + DqAccumLayout::piece_offset(p, work.ws_row0, head, row_block, column0 / 64, kD) +
           (column0 % 64) * 64;
  }
  const int piece_index = kM == 64 ? Cfg::kDqPiecesPerConsumer * consumer + piece : 0;
  return p.dq_accum + DqAccumLayout::piece_offset(p, work.ws_row0, head, row_block, piece_index, kD);
}

// The deterministic mode: once the writer's add has landed in global memory, counts it into the
// block's turn (what the next key block's writer waits for).
__device__ __forceinline__ void count_landed_add(int* turn) {
  using namespace ptx;
  bulk_wait_all();
  fence_proxy_async_global();
  add_release_gpu(turn, 1);
}

template <class Cfg>
__device__ __forceinline__ void run_dq_writer(BackwardSharedStorage<Cfg>& ss, const BackwardParams& p,
                                              const KeyBlockWork& work, int consumer) {
  using namespace ptx;
  constexpr int kM = Cfg::kBlockM;
  const bool leader = threadIdx.x % 32 == 0;
  constexpr int kPieces = Cfg::kDqPiecesPerConsumer;
  const int ordinals = work.steps() * kPieces;
  for (int ordinal = 0; ordinal < ordinals; ++ordinal) {
    const int step = ordinal / kPieces, piece = ordinal % kPieces;
    const int head = work.head(step);
    const int row_block = dq_row_block<Cfg>(work, step, consumer);
    named_barrier_sync(BackwardBarrier::kDqFull0 + consumer, BackwardBarrier::kDqThreads);
    int* turn = nullptr;
    if (leader) {
      float* dst = dq_piece_destination<Cfg>(p, work, step, piece, consumer);
      if constexpr (Cfg::kDeterministic && Cfg::kDqTransposed) {
        // rows (ws_row0 + head x rows) and kM x m_block are multiples of kM (the granule's)
        turn = p.turns + (work.ws_row0 + static_cast<int64_t>(head) * p.rows) / kM + work.m_block<Cfg>(step);
      } else if constexpr (Cfg::kDeterministic) {
        turn = p.turns + (work.ws_row0 + static_cast<int64_t>(head) * p.rows) / 64 + row_block;
      }
      if constexpr (Cfg::kDeterministic) {
        const int mine = dq_turn(work.n_block, work.m_block<Cfg>(step), kM, Cfg::kBlockN, work.seqlen_q, work.seqlen_k,
                                 Cfg::kCausal, p.band) *
                         Cfg::kDqAddsPerKeyBlock;  // each key block's pieces in a block (kD / 64; d = 512: from
                                                   // its two CTAs; 32-column pieces: kD / 32)
        while (load_acquire_gpu(turn) < mine) {
        }
        fence_proxy_async_global();
      }
      bulk_reduce_add_f32(dst, smem_addr(ss.dq_piece[consumer]), Cfg::kDqPieceFloats * 4);
      tma_store_commit();
      if (ordinal + 1 < ordinals) tma_store_wait_read();
    }
    __syncwarp();
    if (ordinal + 1 < ordinals)  // the consumer waits for this before its next piece
      named_barrier_arrive(BackwardBarrier::kDqEmpty0 + consumer, BackwardBarrier::kDqThreads);
    // Deterministic: the turn only after the buffer went back to the consumer, so that the wait
    // for the add's completion overlaps the consumer's next piece (run 237: +6-8% at d = 256,
    // where a consumer hands over four pieces a step through one buffer).
    if constexpr (Cfg::kDeterministic) {
      if (leader) count_landed_add(turn);
    }
  }
  if (leader) bulk_wait_all();  // the last adds have landed before the CTA (and its shared memory) ends
}

}  // namespace warpattn::detail
