// The KV-cache producer and cache issuers of a kernel whose producer warpgroup keeps 24
// registers (ForwardConfig's kWideConsumers: E4M3 at d = 256, whose consumers take 240).
//
// run_producer and run_cache_issuer (producer.cuh) spilled there (128-144 bytes, ptxas -v, read
// in the SASS: every spill after the producer's setmaxnreg.dec), for two reasons:
//  - NVVM hoists the launch's constants (the block table and its stride, the page size, the
//    box counts, the lengths' capacity and appends, the packing, the grid) and the products made
//    of them out of the producer's loops into registers, which ptxas then spills rather than
//    reloads from the constant bank;
//  - the producer holds the current tile (its key tiles, sequence, head) across the enumeration
//    of the next one (kv_cache_piece: five divisions), and each box's page look-up is a signed
//    division by the page size beside a 64-bit table index.
// Here the same loads go out in the same order, with the same barriers, from code that holds
// less: the parameters are read through an address ptxas folds but NVVM cannot hoist
// (fresh_params), so they come from the constant bank where they are used; the producer reads
// its tile back from the slot it published (TileSlots::own) after the next one is enumerated
// instead of holding it; the box shares and page look-ups are unsigned and division-free where
// the layout allows (boxes and issuers are powers of two). The tile counter is always there for
// a KV-cache launch (run_kvcache.cuh), so the chooser's static order is left out.
// Only these kernels compile this code: the others keep producer.cuh's, SASS unchanged.
// Built for the E4M3 cache at d = 256 (forward_kvcache_fp8_d256.cu): with this code, the
// issuers' single ring register (run_lean_cache_issuer) and consumer.cuh's kLeanRegisters its
// four kernels have 0 stack and 0 spills (ptxas -v, nvcc 13.0), from 140-144 bytes of spill
// stores with producer.cuh's (docs/decode-fp8-cache-design.md, "Head dim 256").
#pragma once

#include "hopper/producer.cuh"

namespace warpattn::detail {

template <class Cfg>
inline constexpr bool kLeanCacheProducer = Cfg::kKvCache && Cfg::kProducerRegisters <= 24;

// params at an address offset by a zero that NVVM cannot see through (an asm statement run
// each time), so that the loads it feeds stay where they are used; ptxas folds the zero and
// reads the constant bank there.
__device__ __forceinline__ const ForwardParams& fresh_params(const ForwardParams& params) {
  uint32_t zero;
  asm volatile("mov.u32 %0, 0;" : "=r"(zero));
  return (&params)[zero];
}

// gridDim.x, read where it is used (ptxas otherwise holds it, and the value less one, across the
// producer's loop, and spills both).
__device__ __forceinline__ int fresh_grid_size() {
  uint32_t g;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(g));
  return static_cast<int>(g);
}

// The issuer's index (lane 0 of producer warp `issuer`), read again from the thread index where
// it is used rather than held (the producer: 0).
__device__ __forceinline__ int fresh_issuer(int issuer) {
  if (issuer == 0) return 0;
  uint32_t t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return static_cast<int>(t / 32);
}

// cache_box (kv_pages.hpp) with unsigned arithmetic: key, batch and the page size are
// non-negative, so the quotients are the same.
__device__ __forceinline__ CacheBox lean_cache_box(const KvPages& kv, int batch, int key, int seqlen_k) {
  if (key >= seqlen_k) return {-1, 0};
  if (kv.table == nullptr) return {batch, key};
  const uint32_t page_size = static_cast<uint32_t>(kv.page_size);
  const uint32_t slot = static_cast<uint32_t>(key) / page_size;
  const int page = kv.table[static_cast<uint64_t>(static_cast<uint32_t>(batch)) * static_cast<uint64_t>(kv.table_stride) + slot];
  if (page < 0 || page >= kv.num_pages) return {-1, 0};
  return {page, static_cast<int>(static_cast<uint32_t>(key) - slot * page_size)};
}

// How far apart an issuer's boxes are in a key tile: issuers x box_rows = min(kBlockN,
// kCacheIssuers x box_rows) rows (see lean_load_cache_tile).
template <class Cfg>
__device__ __forceinline__ int lean_box_step(const ForwardParams& params) {
  return min(Cfg::kBlockN, kCacheIssuers * fresh_params(params).kv_pages.box_rows);
}

// One key tile's K (kVt false) or Vᵀ (kVt true) boxes of this issuer, as load_kv_tile and
// load_cache_tile load them: wait for the ring slot, expect this issuer's bytes, then its boxes
// issuer, issuer + issuers, ... of the tile, walked by their first row in the tile. (boxes =
// kBlockN / box_rows and kCacheIssuers are powers of two and issuers = min(boxes,
// kCacheIssuers) (cache_issuers), so an issuer's boxes are issuers x box_rows = min(kBlockN,
// kCacheIssuers box_rows) rows apart, and hold kBlockN / issuers = max(box_rows, kBlockN /
// kCacheIssuers) rows: load_kv_tile's mine x box_rows.)
template <class Cfg, bool kVt, int kTileBytes>
__device__ __forceinline__ void lean_load_cache_tile(uint8_t (&tiles)[Cfg::kStages][kTileBytes],
                                                     uint64_t (&full)[Cfg::kStages], uint64_t (&empty)[Cfg::kStages],
                                                     const CUtensorMap* map, const ForwardParams& params, int ordinal,
                                                     int n_block, int head_kv, int batch, int seqlen_k, int issuer) {
  using namespace ptx;
  static_assert(Cfg::kFp8 && Cfg::kVtSlices, "an E4M3 cache: K through a 1-byte panel map, Vᵀ in 16-key slices");
  const RingSlot slot = ring_slot<Cfg::kStages>(ordinal);
  mbarrier_wait(smem_addr(&empty[slot.stage]), slot.phase ^ 1);
  const uint32_t bar = smem_addr(&full[slot.stage]);
  const uint32_t dst = smem_addr(tiles[slot.stage]);
  const int box_rows = fresh_params(params).kv_pages.box_rows;
  // (even past seqlen_k; Vᵀ's box has K's bytes: box_rows x head_dim)
  mbarrier_arrive_expect_tx(bar, max(box_rows, Cfg::kBlockN / kCacheIssuers) * Cfg::kPanels * Cfg::kSwizzleBytes);
  // The boxes are walked by key: row_in_tile = key % kBlockN (the tile starts at a multiple of
  // kBlockN, a power of two), and the walk ends when it wraps back below one step.
  static_assert((Cfg::kBlockN & (Cfg::kBlockN - 1)) == 0, "key tiles of a power of two");
  int key = n_block * Cfg::kBlockN + fresh_issuer(issuer) * box_rows;
  do {
    const KvPages& kv = fresh_params(params).kv_pages;
    const int row_in_tile = key & (Cfg::kBlockN - 1);
    const CacheBox box = lean_cache_box(kv, batch, key, seqlen_k);
    const auto load = [&](uint32_t to, int c0, int c1, int c2) {
      if (kv.l2_evict_first)
        tma_load_5d_hint(to, map, bar, l2_evict_first_policy(), c0, c1, c2, head_kv, box.page);
      else
        tma_load_5d(to, map, bar, c0, c1, c2, head_kv, box.page);
    };
    if constexpr (kVt) {
      load(dst + row_in_tile * Cfg::kHeadDim, 0, 0, box.row / 16);
    } else {
#pragma unroll
      for (int p = 0; p < Cfg::kPanels; ++p) load(dst + (p * Cfg::kBlockN + row_in_tile) * Cfg::kSwizzleBytes, 0, box.row, p);
    }
    key += lean_box_step<Cfg>(params);
  } while ((key & (Cfg::kBlockN - 1)) >= lean_box_step<Cfg>(params));
}

// TileKvStream's order (K of the first key tile, then K of it with V of it - 1, then the last V)
// on lean_load_cache_tile; `kv` the ring ordinal of the tile's first key tile, n_end - 1 its key
// block.
template <class Cfg>
struct LeanCacheStream {
  SharedStorage<Cfg>& ss;
  const CUtensorMap* tm_k;
  const CUtensorMap* tm_v;
  const ForwardParams& params;
  int kv, n_end, head_kv, batch, seqlen_k, issuer;

  __device__ __forceinline__ void k(int it) const {
    lean_load_cache_tile<Cfg, false>(ss.k, ss.k_full, ss.k_empty, tm_k, params, kv + it, n_end - 1 - it, head_kv, batch,
                                     seqlen_k, issuer);
  }
  __device__ __forceinline__ void v(int it) const {
    lean_load_cache_tile<Cfg, true>(ss.v, ss.v_full, ss.v_empty, tm_v, params, kv + it, n_end - 1 - it, head_kv, batch,
                                    seqlen_k, issuer);
  }
  __device__ __forceinline__ void step(int it) const {
    k(it);
    v(it - 1);
  }
};

// The piece `tile` of the launch as schedule_tile hands it out (the end marker past the pieces).
template <class Cfg>
__device__ __forceinline__ ScheduledTile lean_schedule(int tile, const ForwardParams& params) {
  TileChooser chooser(fresh_params(params).kv_work.pieces);
  chooser.tile = tile;
  return schedule_tile<Cfg>(chooser, fresh_params(params));
}

// run_producer's walk for these kernels: the same tiles, loads, Q and publications in the same
// order. The tile's fields are read from the slot it was published in (TileSlots: slot i & 1 is
// not written again before tile i + 2, which waits for this tile's last loads) where they are
// used, not held in registers across its loads and the next tile's enumeration.
template <class Cfg>
__device__ __forceinline__ void run_lean_cache_producer(SharedStorage<Cfg>& ss, const CUtensorMap* tm_q,
                                                        const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                                        const ForwardParams& params) {
  using namespace ptx;
  static_assert(kLeanCacheProducer<Cfg>, "a KV cache's producer");
  int kv = 0;      // K/V tiles loaded so far
  int q_iter = 0;  // Q tiles loaded so far
  {
    const ScheduledTile w = lean_schedule<Cfg>(static_cast<int>(blockIdx.x), params);
    trace_kv(params, kTraceFirstTile);
    if (w.is_end()) TileChooser(0).retire(fresh_params(params));
    ss.tiles.publish(0, w);
  }
  for (int i = 0;; ++i) {
    const volatile ScheduledTile& w = ss.tiles.tile[i & 1];
    if (w.m_block < 0) break;  // (ScheduledTile::is_end)
    const auto stream = [&] {
      return LeanCacheStream<Cfg>{ss,      tm_k,    tm_v, params, kv, w.n_end, w.head / fresh_params(params).kv_group,
                                  w.batch, w.seqlen_k, 0};
    };
    int it0 = 1;  // the tile's first step loaded in the rest below
    if (w.n_tiles > 0) {
      stream().k(0);
      if (i == 0) trace_kv(params, kTraceFirstLoad);
      if constexpr (Cfg::kEarlyKv) {
        if (kv == 0) {  // as run_producer: the first tile's first steps before Q's quantisation ends
          for (; it0 < w.n_tiles && it0 < Cfg::kStages; ++it0) stream().step(it0);
          wait_for_preceding_grid();
        }
      }
      const RingSlot qs = ring_slot<Cfg::kQStages>(q_iter);
      mbarrier_wait(smem_addr(&ss.q_empty[qs.stage]), qs.phase ^ 1);
      const ForwardParams& p = fresh_params(params);
      load_packed_q<Cfg>(smem_addr(ss.q[qs.stage]), tm_q, smem_addr(&ss.q_full[qs.stage]),
                         first_row_of_block<Cfg>(w.m_block, p), w.head, w.batch, p.packing);
    }
    {  // TileChooser::advance and retire on the tile counter (a KV-cache launch always has one),
       // and the next tile
      const ForwardParams& p = fresh_params(params);
      const int grid = fresh_grid_size();
      const int tile = grid + atomicAdd(p.tile_counter, 1);
      if (tile >= p.kv_work.pieces) {
        __threadfence();
        if (atomicAdd(p.tile_counter + 1, 1) == grid - 1) {
          p.tile_counter[0] = 0;
          p.tile_counter[1] = 0;
        }
      }
      ss.tiles.publish(i + 1, lean_schedule<Cfg>(tile, params));
    }
    if (i == 0) trace_kv(params, kTraceFirstPublish);
    if (w.n_tiles > 0) {
      for (int it = it0; it < w.n_tiles; ++it) stream().step(it);
      stream().v(w.n_tiles - 1);
      trace_kv(params, kTraceLastLoad);
      kv += w.n_tiles;
      ++q_iter;
    }
  }
}

// run_cache_issuer on lean_load_cache_tile: the same loads in TileKvStream's order. Held across
// a tile's loads: its lowest key block, the key block loaded, the KV head, sequence and length,
// and one register `ring` for both rings the issuer walks: bits 0-1 the K/V ring ordinal mod 4
// (ring_slot<2> reads no more of it) and bits 2-3 the tile slots' count mod 4 (receive reads
// no more of it), instead of the tile count, the ordinal and the tile's first and last
// ordinals.
template <class Cfg>
__device__ __forceinline__ void run_lean_cache_issuer(SharedStorage<Cfg>& ss, const CUtensorMap* tm_k,
                                                      const CUtensorMap* tm_v, const ForwardParams& params,
                                                      int issuer) {
  static_assert(kLeanCacheProducer<Cfg>, "a KV cache's issuer");
  static_assert(Cfg::kStages == 2, "the ring ordinal kept mod 4");
  const auto next = [](uint32_t ring) { return (ring & 12u) | ((ring + 1u) & 3u); };
  uint32_t ring = 0;
  for (;;) {
    const ScheduledTile w = ss.tiles.template receive<true, true>(static_cast<int>(ring >> 2));
    ring = (ring + 4u) & 15u;
    if (w.is_end()) break;
    if (w.n_tiles == 0) continue;
    const int head_kv = w.head / fresh_params(params).kv_group;
    const auto k = [&](uint32_t ordinal, int n_block) {
      lean_load_cache_tile<Cfg, false>(ss.k, ss.k_full, ss.k_empty, tm_k, params, static_cast<int>(ordinal), n_block,
                                       head_kv, w.batch, w.seqlen_k, issuer);
    };
    const auto v = [&](uint32_t ordinal, int n_block) {
      lean_load_cache_tile<Cfg, true>(ss.v, ss.v_full, ss.v_empty, tm_v, params, static_cast<int>(ordinal), n_block,
                                      head_kv, w.batch, w.seqlen_k, issuer);
    };
    // key blocks n_end - 1 down to n_lo: K of the first, then K of one with V of the one above,
    // then the last V
    const int n_lo = w.n_end - w.n_tiles;
    int n = w.n_end - 1;
    k(ring, n);
    for (; n > n_lo; --n) {
      k(ring + 1u, n - 1);
      v(ring, n);
      ring = next(ring);
    }
    v(ring, n_lo);
    ring = next(ring);
  }
}

}  // namespace warpattn::detail
