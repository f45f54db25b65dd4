// The Hopper forward kernel: a persistent grid of CTAs, each of three (or four) warpgroups.
// Warpgroup 0 produces (TMA), the others consume (WGMMA + softmax), 64 query rows each, for
// every work tile (kBlockM query rows of one batch and head) the scheduler hands the CTA.
#pragma once
#include <cuda.h>

#include "hopper/consumer.cuh"
#include "hopper/decode/few_rows_tile.cuh"
#include "hopper/decode/lean_cache_producer.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/kv_tiles.hpp"
#include "hopper/log2e.hpp"
#include "hopper/producer.cuh"
#include "hopper/ptx/grid_dependency.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/shared_storage.cuh"
#include "hopper/softmax.cuh"
#include "hopper/split_head_dim.cuh"
#include "hopper/split_tail_combine.cuh"
#include "hopper/tile_scheduler.cuh"
#include "hopper/backward/workspace.hpp"

namespace warpattn::detail {

// issuers: the threads that load each K and V tile (a KV cache's cache_issuers; 1 otherwise),
// each arriving on its full barrier; the issuers past the producer read the tiles too.
template <class Cfg>
__device__ __forceinline__ void init_barriers(SharedStorage<Cfg>& ss, int issuers) {
  using namespace ptx;
#pragma unroll
  for (int s = 0; s < Cfg::kQStages; ++s) {
    mbarrier_init(smem_addr(&ss.q_full[s]), 1);
    mbarrier_init(smem_addr(&ss.q_empty[s]), Cfg::kConsumerWarpgroups);
  }
  ss.tiles.init(128 * Cfg::kConsumerWarpgroups + issuers - 1);
#pragma unroll
  for (int s = 0; s < Cfg::kStages; ++s) {
    mbarrier_init(smem_addr(&ss.k_full[s]), issuers);
    mbarrier_init(smem_addr(&ss.v_full[s]), issuers);
    mbarrier_init(smem_addr(&ss.k_empty[s]), Cfg::kConsumerWarpgroups);
    mbarrier_init(smem_addr(&ss.v_empty[s]), Cfg::kConsumerWarpgroups);
  }
  fence_barrier_init();
  fence_proxy_async_shared();
}

// The key tiles of work tile w that consumer warpgroup `warpgroup` visits itself
// (kWarpgroupKeyTiles<Cfg>; otherwise all). A KV cache's packed rows: all, or none where the
// warpgroup's first row (its lowest position) holds no stored row, as the padding rows of a
// decode tile's warpgroup 1 (4 real rows of 128 at one position with 4 query heads a KV head).
template <class Cfg>
__device__ __forceinline__ WarpgroupTiles own_key_tiles(const ScheduledTile& w, int warpgroup,
                                                       const ForwardParams& params, int seqlen_q, int seqlen_k) {
  const WarpgroupTiles all{0, w.n_tiles};
  if constexpr (!kWarpgroupKeyTiles<Cfg>) {
    return all;
  } else if constexpr (Cfg::kKvCache) {
    const int first_position = first_row_of_block<Cfg>(w.m_block, params);
    return packed_row_place(64 * warpgroup, first_position, w.head, params.packing, seqlen_q).stored
               ? all
               : WarpgroupTiles{w.n_tiles, 0};
  } else {
    return warpgroup_key_tiles(w.m_block * Cfg::kBlockM + 64 * warpgroup, 64, Cfg::kBlockN, seqlen_q, seqlen_k,
                               Cfg::kCausal ? params.band : KeyBand{}, w.n_end, w.n_tiles);
  }
}

// Whether the tile's rows take the precise path (ConsumerTile::run_precise): 16-bit only, FP8 P
// has 3 mantissa bits and splitting it would not buy the 16-bit path's precision. Two calls, not
// one through first_row_of_block/rows_of_block: that form reassociates the 16-bit causal
// kernels' row arithmetic (their SASS changed); this one keeps it as it was.
template <class Cfg>
__device__ __forceinline__ bool tile_sees_few_keys(const ScheduledTile& w, const ForwardParams& params, int seqlen_q,
                                                   int seqlen_k) {
  if constexpr (Cfg::kFp8)
    return false;
  else if constexpr (Cfg::kKvCache)  // a block of positions, or the prefill block its first lies in
    return kvcache_sees_few_keys(first_row_of_block<Cfg>(w.m_block, params), rows_of_block<Cfg>(params), seqlen_q,
                                 seqlen_k, Cfg::kCausal ? params.band : KeyBand{}, Cfg::kBlockM);
  else
    return sees_few_keys(w.m_block * Cfg::kBlockM, Cfg::kBlockM, seqlen_q, seqlen_k,
                         Cfg::kCausal ? params.band : KeyBand{});
}

template <class Cfg>
__device__ __forceinline__ void run_tile(const ConsumerTile<Cfg>& tile, bool few_keys, float (&o)[Cfg::kOCols / 2],
                                         OnlineSoftmax& softmax) {
  if constexpr (Cfg::kFp8)
    tile.run(o, softmax);
  else if (few_keys)
    tile.run_precise(o, softmax);
  else
    tile.run(o, softmax);
}

template <class Cfg>
__device__ __forceinline__ void run_consumer_warpgroup(SharedStorage<Cfg>& ss, const ForwardParams& params,
                                                       int warpgroup) {
  const PingPong turns{warpgroup, Cfg::kConsumerWarpgroups};
  const FragmentCoords f(threadIdx.x % 128);
  turns.start();
  int kv = 0, q_iter = 0;  // as in the producer
  for (int i = 0;; ++i) {
    // (A KV cache's pieces carry their partial state's slot where a dense tile has its piece.)
    const ScheduledTile w =
        ss.tiles.template receive<(!Cfg::kCausal && !Cfg::kVarlen) || Cfg::kKvCache, Cfg::kVarlen>(i);
    if (w.is_end()) break;
    const int n_tiles = w.n_tiles;
    // The tile's sequence: a packed batch's own, or the launch's.
    const int seqlen_q = Cfg::kVarlen ? w.seqlen_q : params.seqlen_q;
    const int seqlen_k = Cfg::kVarlen ? w.seqlen_k : params.seqlen_k;
    float o[Cfg::kOCols / 2];
#pragma unroll
    for (int j = 0; j < Cfg::kOCols / 2; ++j) o[j] = 0.f;
    OnlineSoftmax softmax(Cfg::kPLog2Offset, Cfg::kStaleLog2);
    if (n_tiles > 0) {
      const RingSlot qs = ring_slot<Cfg::kQStages>(q_iter);
      TileContext t{warpgroup, w.m_block, w.head, w.batch, n_tiles, w.n_end, kv, qs.stage, seqlen_q, seqlen_k};
      // (A KV cache's descales are indexed by its tiles' own blocks: run_kvcache.cuh's set_cache_descales.)
      if constexpr (Cfg::kFp8 && Cfg::kVarlen && !Cfg::kKvCache) {  // the descale arrays' batch stride is 0 (run_forward_varlen)
        t.q_block0 = static_cast<int>(varlen_row0(w.q_offset, w.batch) / Cfg::kDescaleRows);
        t.k_block0 = static_cast<int>(varlen_row0(w.k_offset, w.batch) / Cfg::kDescaleRows);
      }
      ptx::mbarrier_wait(ptx::smem_addr(&ss.q_full[qs.stage]), qs.phase);
      if constexpr (Cfg::kKvCache)
        if (i == 0 && threadIdx.x == 128) trace_kv(params, kTraceQArrived);
      if constexpr (!kWarpgroupKeyTiles<Cfg>) {
        const ConsumerTile<Cfg> tile(ss, params, t);
        run_tile(tile, tile_sees_few_keys<Cfg>(w, params, seqlen_q, seqlen_k), o, softmax);
        kv += n_tiles;
      } else {
        // The warpgroup's own key tiles (not on the precise path, whose rows see few keys: rare,
        // and two turns a key tile).
        const bool few_keys = tile_sees_few_keys<Cfg>(w, params, seqlen_q, seqlen_k);
        // A KV cache's tile of few real rows: both warpgroups on all its keys, its rows in wgmma's N
        // (few_rows_tile.cuh).
        const int rows = kvcache_tile_rows(first_row_of_block<Cfg>(w.m_block, params), params, seqlen_q);
        if (kFewRowsTiles<Cfg> && !few_keys && rows <= kFewRows) {
          if constexpr (kFewRowsTiles<Cfg>) run_few_rows_tile<Cfg>(ss, params, t, rows, o, softmax);
          kv += n_tiles;
        } else {
          const WarpgroupTiles own =
              few_keys ? WarpgroupTiles{0, n_tiles} : own_key_tiles<Cfg>(w, warpgroup, params, seqlen_q, seqlen_k);
          skip_key_tiles<Cfg>(ss, turns, kv, own.front);
          // (A KV cache's warpgroup takes all or none: nothing after its own, and nothing held across them.)
          const int back = Cfg::kKvCache ? 0 : n_tiles - own.front - own.count;
          t.n_end -= own.front, t.n_tiles = own.count, t.kv_base += own.front;
          if (own.count > 0) {
            run_tile(ConsumerTile<Cfg>(ss, params, t), few_keys, o, softmax);
          } else {  // no row of this warpgroup sees a key (O = 0, lse = -inf): run's turn for its last P·V
            release_slot(&ss.q_empty[qs.stage]);
            turns.wait_turn();
            turns.pass_turn();
          }
          skip_key_tiles<Cfg>(ss, turns, t.kv_base + t.n_tiles, back);
          kv = t.kv_base + t.n_tiles + back;
        }
      }
      ++q_iter;
    }
    // A piece of the split tail leaves its partial state to combine_split_tail_kernel.
    if constexpr (!Cfg::kCausal && !Cfg::kVarlen) {
      if (w.piece >= 0) {
        PartialState<Cfg>(params, 2 * static_cast<int>(blockIdx.x) + w.piece, warpgroup, threadIdx.x % 128)
            .store(o, softmax);
        continue;
      }
    }
    float lse[2];
    if constexpr (Cfg::kKvCache) {  // packed rows: each row's own query head
      const int first_position = first_row_of_block<Cfg>(w.m_block, params);
      if (w.piece >= 0) {  // a piece of the tile's keys: its partial state, for combine_kvcache_splits_kernel
        if (holds_stored_rows(warpgroup, f, first_position, w.head, params.packing, seqlen_q))
          PartialState<Cfg>(params, w.piece, warpgroup, threadIdx.x % 128).store(o, softmax);
        continue;
      }
      float sink_log2[2];
      packed_row_sinks(params, warpgroup, f, first_position, w.head, seqlen_q, sink_log2);
      softmax.finalize_rows(o, lse, sink_log2[0], sink_log2[1]);
      store_packed_output<Cfg>(o, lse, params, f, warpgroup, first_position, w.head, w.batch, seqlen_q);
      continue;
    }
    // Read here rather than with the tile: a register held across the main loop costs more than
    // one load's latency per tile.
    const float sink_log2 = params.sinks != nullptr ? params.sinks[w.head * params.sinks_stride] * static_cast<float>(kLog2e)
                                                  : -INFINITY;
    softmax.finalize(o, lse, sink_log2);
    store_output<Cfg>(o, lse, params, f, warpgroup, w.m_block, w.head, w.batch, w.q_offset, seqlen_q);
  }
  turns.finish();
  if constexpr (Cfg::kKvCache)
    if (threadIdx.x % 128 == 0) trace_kv(params, kTraceConsumerDone + warpgroup);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attention_forward_kernel(const __grid_constant__ CUtensorMap tm_q,
                             const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_v,
                             const __grid_constant__ ForwardParams params) {
  using namespace ptx;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<SharedStorage<Cfg>*>(smem_raw);

  // A KV-cache launch's combine (when its keys are split) may be scheduled from here on: it
  // waits for this grid's end itself (dependent_launch.cuh), and cannot take an SM before a CTA
  // of this persistent grid leaves one.
  if constexpr (Cfg::kKvCache) {
    if (threadIdx.x == 0) trace_kv(params, kTraceEntry);
    ptx::allow_dependent_launch();
  }
  int issuers = 1;
  if constexpr (Cfg::kKvCache) issuers = cache_issuers(params.kv_pages);
  if (threadIdx.x == 0) init_barriers(ss, issuers);
  // A KV-cache step is launched as a programmatic dependent of whatever precedes it on the
  // stream (run_kvcache.cuh), so that its launch and this prologue overlap that kernel's tail:
  // nothing it reads (q, the lengths, the caches the append wrote, the page table) nor the
  // partial states that the previous step's combine may still be reading is touched before this
  // wait. An E4M3 cache's step follows its Q quantisation (kEarlyKv: only the producer's Q load
  // and the consumers wait, below; the append ran before the quantisation).
  if constexpr (Cfg::kKvCache && !Cfg::kEarlyKv) ptx::wait_for_preceding_grid();
  __syncthreads();  // the last CTA-wide barrier: roles split below
  if constexpr (Cfg::kKvCache)
    if (threadIdx.x == 0) trace_kv(params, kTraceReady);

  // Broadcast from lane 0 so that ptxas knows the value is the same in the whole warp: what
  // depends on it (the Q rows' descriptor, ...) can then live in uniform registers.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == 0) {
    release_registers<Cfg::kProducerRegisters>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_q);
      prefetch_tensor_map(&tm_k);
      prefetch_tensor_map(&tm_v);
      if constexpr (kLeanCacheProducer<Cfg>)  // (decode/lean_cache_producer.cuh: a producer of 24 registers)
        run_lean_cache_producer<Cfg>(ss, &tm_q, &tm_k, &tm_v, params);
      else
        run_producer<Cfg>(ss, &tm_q, &tm_k, &tm_v, params);
    } else if constexpr (Cfg::kKvCache) {
      const int warp = static_cast<int>(threadIdx.x) / 32;
      if (threadIdx.x % 32 == 0 && warp < issuers) {
        if constexpr (kLeanCacheProducer<Cfg>)
          run_lean_cache_issuer<Cfg>(ss, &tm_k, &tm_v, params, warp);
        else
          run_cache_issuer<Cfg>(ss, &tm_k, &tm_v, params, warp);
      }
    }
  } else {
    acquire_registers<Cfg::kConsumerRegisters>();
    if constexpr (Cfg::kEarlyKv) ptx::wait_for_preceding_grid();  // (the tiles read Q's descales)
    if constexpr (Cfg::kSplitHeadDim)
      run_split_head_dim_consumer<Cfg>(ss, params, warpgroup - 1);
    else
      run_consumer_warpgroup<Cfg>(ss, params, warpgroup - 1);
  }
}

}  // namespace warpattn::detail
