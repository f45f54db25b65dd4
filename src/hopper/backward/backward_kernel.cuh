// The Hopper backward's main kernel: one CTA per (key block, KV head, batch) (two at d = 512,
// one per column half: kColumnHalves), three warpgroups: warpgroup 0 produces (warp 0 loads
// through TMA, warps 1 and 2 add the consumers' dQ pieces to global memory, unless the consumers
// add them from registers: Cfg::kDqFromRegisters), the other two consume
// (backward_consumer.cuh; d = 256: backward_consumer_n80.cuh).
// Not persistent: the grid is ordered key block fastest, so under the causal mask each (batch,
// KV head)'s long key blocks (the first ones see the most query blocks) start first, and in the
// deterministic mode the key blocks a CTA waits for were launched before it; at d = 256 the
// causal kernel maps the grid to longest first over groups of rows instead (key_block_work).
#pragma once
#include <cuda.h>

#include "hopper/backward/backward_consumer.cuh"
#include "hopper/backward/backward_consumer_n80.cuh"
#include "hopper/backward/backward_dq_writer.cuh"
#include "hopper/backward/backward_producer.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/backward/workspace.hpp"
#include "hopper/varlen/varlen_tiles.hpp"

namespace warpattn::detail {

// This CTA's key block. Dense: the grid (key blocks, KV heads, batch), key blocks first-first,
// except for the banded kernels' orders: the deterministic one needs them last-first (dq_turn),
// the other takes them longest first in groups of rows sized for the L2 (params.
// longest_first_groups > 0; grouped_longest_first); the tail split (Cfg::kTailSplit, params.tail):
// a 1-D grid in the same order, whose last tiles are cut into parts, each a range of the key
// block's steps. A packed batch: entry blockIdx.x of the plan (in the same orders within a
// sequence, varlen_tiles.hpp), or n_block -1 past its end.
// d = 512 (Cfg::kColumnHalves = 2): CTAs 2t and 2t + 1 take key block t's two column halves
// (column_half, backward_consumer.cuh), so a key block's index is blockIdx.x / 2 and the grid's
// key blocks gridDim.x / 2.
template <class Cfg>
__device__ __forceinline__ KeyBlockWork key_block_work(const BackwardParams& params) {
  KeyBlockWork work;
  work.group = params.kv_group;
  if (params.varlen_tiles != nullptr) {
    const int t = static_cast<int>(blockIdx.x / Cfg::kColumnHalves);
    if (t >= *params.varlen_tile_count) {
      work.n_block = -1;
      return work;
    }
    const VarlenTile& e = params.varlen_tiles[t];
    work.n_block = e.block, work.head_kv = e.head, work.batch = 0;
    work.seqlen_q = e.seqlen_q, work.seqlen_k = e.seqlen_k, work.q_offset = e.q_offset, work.k_offset = e.k_offset;
    work.ws_row0 = varlen_row0<Cfg::kRowGranule>(e.q_offset, e.batch);
  } else if (Cfg::kLongestFirst && params.longest_first_groups > 0) {
    // The banded order (key_block_work.hpp's grouped_longest_first) over the grid's tiles in
    // launch order; a tile's kColumnHalves CTAs stay adjacent.
    const unsigned tiles = gridDim.x / Cfg::kColumnHalves;
    const unsigned tile = blockIdx.x / Cfg::kColumnHalves + tiles * (blockIdx.y + gridDim.y * blockIdx.z);
    const KeyBlockOrder o = grouped_longest_first(static_cast<int>(tile), static_cast<int>(tiles),
                                                  params.heads_kv * params.batch, params.longest_first_groups);
    work.n_block = o.n_block;
    work.head_kv = o.row % params.heads_kv;
    work.batch = o.row / params.heads_kv;
    work.seqlen_q = params.seqlen_q, work.seqlen_k = params.seqlen_k, work.q_offset = 0, work.k_offset = 0;
    work.ws_row0 = static_cast<int64_t>(work.batch) * params.heads_q * params.rows;
  } else if (Cfg::kTailSplit && params.tail.split_tiles > 0) {
    // The tail split's 1-D grid: the tiles in the 3-D grid's order (key blocks fastest, then KV
    // heads, then batches), the cut ones last, each as its parts (tail_split_part).
    const TilePart tp = tail_split_part(static_cast<int>(blockIdx.x), params.tail_tiles, params.tail);
    const int n_blocks = ceil_div(params.seqlen_k, Cfg::kBlockN);
    const int row = tp.tile / n_blocks;
    work.n_block = tp.tile - row * n_blocks;
    work.head_kv = row % params.heads_kv;
    work.batch = row / params.heads_kv;
    work.part = tp.part;
    work.cut_tile = tp.tile - (params.tail_tiles - params.tail.split_tiles);
    work.seqlen_q = params.seqlen_q, work.seqlen_k = params.seqlen_k, work.q_offset = 0, work.k_offset = 0;
    work.ws_row0 = static_cast<int64_t>(work.batch) * params.heads_q * params.rows;
  } else {
    if constexpr (Cfg::kColumnHalves == 1) {
      work.n_block = Cfg::kCausal && Cfg::kDeterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    } else {  // the same over the grid's key blocks (as written above, the others' code is as before)
      const unsigned tile = blockIdx.x / Cfg::kColumnHalves, tiles = gridDim.x / Cfg::kColumnHalves;
      work.n_block = Cfg::kCausal && Cfg::kDeterministic ? tiles - 1 - tile : tile;
    }
    work.head_kv = blockIdx.y;
    work.batch = blockIdx.z;
    work.seqlen_q = params.seqlen_q, work.seqlen_k = params.seqlen_k, work.q_offset = 0, work.k_offset = 0;
    work.ws_row0 = static_cast<int64_t>(work.batch) * params.heads_q * params.rows;
  }
  work.m = query_block_range(work.n_block, Cfg::kBlockN, Cfg::kBlockM, work.seqlen_q, work.seqlen_k,
                             Cfg::kCausal ? params.band : KeyBand{});
  const StepRange steps = part_steps(work.all_steps(), work.part, params.tail.parts);
  work.take_steps(steps.begin, steps.end);
  if constexpr (Cfg::kRotated)
    work.rotation =
        walk_rotation(work.n_block, ceil_div(work.seqlen_k, Cfg::kBlockN), work.m.end - work.m.begin, Cfg::kRotate);
  return work;
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attention_backward_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                              const __grid_constant__ BackwardParams params) {
  using namespace ptx;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<BackwardSharedStorage<Cfg>*>(smem_raw);
  if (threadIdx.x == 0) {
    mbarrier_init(smem_addr(&ss.kv_full), 1);
#pragma unroll
    for (int s = 0; s < Cfg::kQStages; ++s) {
      mbarrier_init(smem_addr(&ss.q_full[s]), 1);
      mbarrier_init(smem_addr(&ss.q_empty[s]), Cfg::kSlotReleases);
    }
#pragma unroll
    for (int s = 0; s < Cfg::kDoStages; ++s) {
      mbarrier_init(smem_addr(&ss.do_full[s]), 1);
      mbarrier_init(smem_addr(&ss.do_empty[s]), Cfg::kSlotReleases);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: roles split below

  const KeyBlockWork work = key_block_work<Cfg>(params);
  if (work.n_block < 0) return;  // a packed batch's grid is sized before its tiles are counted

  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == 0) {
    release_registers<Cfg::kProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (Cfg::kWarpProducer ? __shfl_sync(0xffffffffu, warp, 0) == 0 : threadIdx.x == 0) {
      if (threadIdx.x == 0) {
        prefetch_tensor_map(&tm_q);
        prefetch_tensor_map(&tm_do);
      }
      run_backward_producer<Cfg>(ss, &tm_q, &tm_k, &tm_v, &tm_do, params, work, threadIdx.x == 0);
    } else if (warp == 1 || warp == 2) {
      if constexpr (!Cfg::kDqFromRegisters) run_dq_writer<Cfg>(ss, params, work, warp - 1);
    }
  } else {
    acquire_registers<Cfg::kConsumerRegisters>();
    if constexpr (Cfg::kBlockN80)  // d = 256: 80 keys a CTA
      BackwardConsumerN80<Cfg>(ss, params, work, warpgroup - 1).run();
    else
      BackwardConsumer<Cfg>(ss, params, work, warpgroup - 1).run();
  }
}

}  // namespace warpattn::detail
