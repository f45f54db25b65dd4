// The producer warpgroup: one thread streams, for each work tile, Q once and the K/V tiles
// through the ring, in the order the consumers use them (last key tile first; K_j before
// V_{j+1} so the next S GEMM can start before the previous P·V has its operand).
#pragma once

#include "hopper/ptx/grid_dependency.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/panel_tile.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/kv_tiles.hpp"
#include "hopper/ring_slot.cuh"
#include "hopper/tile_order.hpp"
#include "hopper/shared_storage.cuh"
#include "hopper/tile_scheduler.cuh"
#include "hopper/backward/workspace.hpp"
#include "hopper/varlen/varlen_tiles.hpp"  // the work list walked by varlen launches
#include "hopper/decode/kv_cache_pieces.hpp"  // ... and by KV-cache launches
#include "hopper/decode/kv_trace.cuh"

namespace warpattn::detail {

// A KV cache's key tile (Cfg::kKvCache): params.kv_pages.boxes boxes of box_rows keys, each
// from the page that holds it (decode/kv_pages.hpp), into the tile's rows of every panel; this
// issuer's share of them (cache_issuers: issuer i of n the boxes i, i + n, ...), under an L2
// evict-first policy where the launch chose it (kv.l2_evict_first: a short step's lines then
// replace each other, not the lines the kernels before it left dirty).
// kVt: an E4M3 cache's Vᵀ (Cfg::kVtSlices; tensor_map.hpp's make_vt_slices_tensor_map): a box is
// box_rows / 16 slices of 16 keys x head_dim rows, landing at its keys' slices of the tile.
// An E4M3 cache's K comes through a 1-byte panel map, whose panel is a coordinate of its own.
template <class Cfg, bool kVt = false>
__device__ __forceinline__ void load_cache_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int n_block,
                                                int head_kv, int batch, int seqlen_k, const KvPages& kv, int issuer,
                                                int issuers) {
  using namespace ptx;
  constexpr int kPanelCols = Cfg::kSwizzleBytes / 2;  // 16-bit elements
  const auto load = [&](uint32_t to, int c0, int c1, int c2, int c3, int c4) {
    if (kv.l2_evict_first) {
      tma_load_5d_hint(to, map, bar, l2_evict_first_policy(), c0, c1, c2, c3, c4);
    } else {
      tma_load_5d(to, map, bar, c0, c1, c2, c3, c4);
    }
  };
  for (int j = issuer; j < kv.boxes; j += issuers) {
    const int row_in_tile = j * kv.box_rows;
    const CacheBox box = cache_box(kv, batch, n_block * Cfg::kBlockN + row_in_tile, seqlen_k);
    if constexpr (kVt) {
      static_assert(Cfg::kVtSlices, "Vᵀ from a cache only as slices");
      load(dst + row_in_tile * Cfg::kHeadDim, 0, 0, box.row / 16, head_kv, box.page);
    } else {
#pragma unroll
      for (int p = 0; p < Cfg::kPanels; ++p) {
        if constexpr (Cfg::kFp8)
          load(dst + (p * Cfg::kBlockN + row_in_tile) * Cfg::kSwizzleBytes, 0, box.row, p, head_kv, box.page);
        else
          load(dst + (p * Cfg::kBlockN + row_in_tile) * Cfg::kSwizzleBytes, p * kPanelCols, box.row, 0, head_kv,
               box.page);
      }
    }
  }
}

// kKeysInner: the tensor is FP8's Vᵀ, keys innermost (its map is {keys, head_dim, 1, heads,
// batch}); otherwise a (batch, seqlen, heads, head_dim) panel map. first_key: the sequence's
// first key row in the tensor (packed batches; 0 otherwise). kv: a KV cache's pages
// (Cfg::kKvCache), with the sequence's length; issuer: which of its cache_issuers this thread
// is (each arrives on the full barrier with its own boxes' bytes). kTileBytes: K's or V's tile
// (their head dims may differ: ForwardConfig's kHeadDimV), whose panels it loads.
template <class Cfg, bool kKeysInner = false, int kTileBytes>
__device__ __forceinline__ void load_kv_tile(SharedStorage<Cfg>& ss, const CUtensorMap* map,
                                             uint8_t (&tiles)[Cfg::kStages][kTileBytes],
                                             uint64_t (&full)[Cfg::kStages],
                                             uint64_t (&empty)[Cfg::kStages], int it, int n_block,
                                             int head_kv, int batch, int first_key,
                                             const KvPages* kv = nullptr, int seqlen_k = 0, int issuer = 0) {
  using namespace ptx;
  const RingSlot slot = ring_slot<Cfg::kStages>(it);
  // The slot's previous occupant was released in the phase before this one; on the first lap
  // the "preceding phase" of a fresh barrier counts as complete.
  mbarrier_wait(smem_addr(&empty[slot.stage]), slot.phase ^ 1);
  const uint32_t bar = smem_addr(&full[slot.stage]);
  const int key = first_key + n_block * Cfg::kBlockN;
  if constexpr (Cfg::kKvCache) {
    const int issuers = cache_issuers(*kv), mine = (kv->boxes - issuer + issuers - 1) / issuers;
    // (even past seqlen_k; an E4M3 cache's Vᵀ box has the same bytes: box_rows x head_dim)
    mbarrier_arrive_expect_tx(bar, mine * kv->box_rows * Cfg::kPanels * Cfg::kSwizzleBytes);
    load_cache_tile<Cfg, kKeysInner>(smem_addr(tiles[slot.stage]), map, bar, n_block, head_kv, batch, seqlen_k, *kv,
                                     issuer, issuers);
    return;
  }
  mbarrier_arrive_expect_tx(bar, kTileBytes);  // the full box, even past seqlen_k
  constexpr int kTilePanels = kTileBytes / (Cfg::kBlockN * Cfg::kSwizzleBytes);
  if constexpr (kKeysInner)
    tma_load_5d(smem_addr(tiles[slot.stage]), map, bar, key, 0, 0, head_kv, batch);
  else
    load_panel_tile<kTilePanels, Cfg::kBlockN, Cfg::kSwizzleBytes, Cfg::kFp8>(smem_addr(tiles[slot.stage]), map, bar,
                                                                             key, head_kv, batch);
}

// The first query row (a KV cache's: position) of query block m_block: KV-cache tiles hold
// packing.positions positions of packing.heads query heads (decode_plan.hpp, GqaPacking).
template <class Cfg>
__device__ __forceinline__ int first_row_of_block(int m_block, const ForwardParams& params) {
  if constexpr (Cfg::kKvCache)
    return m_block * params.packing.positions;
  else
    return m_block * Cfg::kBlockM;
}
// The rows (a KV cache's: positions) of a query block.
template <class Cfg>
__device__ __forceinline__ int rows_of_block(const ForwardParams& params) {
  if constexpr (Cfg::kKvCache)
    return params.packing.positions;
  else
    return Cfg::kBlockM;
}

// A KV cache's Q tile (Cfg::kKvCache): packing.positions positions x packing.heads heads of the
// chunk, a box per panel through the packed map (make_packed_q_tensor_map); the bytes it brings.
template <class Cfg>
__device__ __forceinline__ void load_packed_q(uint32_t dst, const CUtensorMap* map, uint32_t bar, int position,
                                              int chunk, int batch, const GqaPacking& packing) {
  using namespace ptx;
  mbarrier_arrive_expect_tx(bar, Cfg::kPanels * Cfg::kSwizzleBytes * packing.heads * packing.positions);
#pragma unroll
  for (int p = 0; p < Cfg::kPanels; ++p)
    tma_load_5d(dst + p * Cfg::kBlockM * Cfg::kSwizzleBytes, map, bar, p * (Cfg::kSwizzleBytes / Cfg::kElementBytes), 0,
                position, chunk, batch);
}

// The tiles the producer hands out whole (TileChooser::whole); a packed batch's count comes
// from its plan, read once per CTA.
template <class Cfg>
__device__ __forceinline__ int whole_tiles(const ForwardParams& params) {
  if constexpr (Cfg::kKvCache) return params.kv_work.pieces;
  else if constexpr (Cfg::kVarlen) return *params.varlen_tile_count;
  else if constexpr (Cfg::kCausal) return total_tiles(params);
  else return params.split.first_tile;
}

// What the chooser points at: a whole tile of tile_order.hpp's order, a piece of the split
// tail, or the end marker.
template <class Cfg>
__device__ __forceinline__ ScheduledTile schedule_tile(const TileChooser& chooser, const ForwardParams& params) {
  constexpr ScheduledTile kEnd{-1, 0, 0, 0, 0, -1, 0, 0, 0, 0};
  if constexpr (Cfg::kKvCache) {  // a piece of a tile (kv_cache_pieces.hpp); its slot: the piece's index when split
    if (chooser.tile >= chooser.whole) return kEnd;
    const TileGrid grid{params.m_blocks, params.heads_q, params.batch, 1};
    const KvCachePiece pc = kv_cache_piece(chooser.tile, params.kv_work, grid, params.packing.positions, Cfg::kBlockN,
                                           params.seqlen_q, Cfg::kCausal ? params.band : KeyBand{});
    return {pc.tile.m_block, pc.tile.head, pc.tile.batch, pc.n_tiles, pc.n_end,
            params.kv_work.splits > 1 ? chooser.tile : -1, 0, params.seqlen_q, 0, pc.seqlen_k};
  } else if constexpr (Cfg::kVarlen) {  // never split: the plan's tile, two 16-byte loads
    if (chooser.tile >= chooser.whole) return kEnd;
    const int4* entry = reinterpret_cast<const int4*>(params.varlen_tiles + chooser.tile);
    const int4 a = entry[0], b = entry[1];
    if constexpr (Cfg::kCausal) {  // the plan has the count; a window's tiles need not start at 0
      const int begin = band_key_begin(a.x * Cfg::kBlockM, b.y, b.w, params.band) / Cfg::kBlockN;
      return {a.x, a.y, a.z, a.w, begin + a.w, -1, b.x, b.y, b.z, b.w};
    }
    return {a.x, a.y, a.z, a.w, a.w, -1, b.x, b.y, b.z, b.w};
  } else if constexpr (Cfg::kCausal) {  // never split
    if (chooser.tile >= chooser.whole) return kEnd;
  } else if (chooser.tile >= params.split.first_tile) {
    SplitTail::Piece pc;
    if (params.split.tiles == 0 || !params.split.piece(static_cast<int>(blockIdx.x), chooser.piece, pc)) return kEnd;
    const WorkTile w = tile_coords(params.split.first_tile + pc.tile, params);
    return {w.m_block, w.head, w.batch, pc.kv_end - pc.kv_begin, pc.kv_end, chooser.piece, 0, 0, 0, 0};
  }
  const WorkTile w = tile_coords(chooser.tile, params);
  const KeyTileRange r = kv_tile_range(w.m_block, Cfg::kBlockM, Cfg::kBlockN, params.seqlen_q, params.seqlen_k,
                                       Cfg::kCausal ? params.band : KeyBand{});
  return {w.m_block, w.head, w.batch, r.count(), r.end, -1, 0, 0, 0, 0};
}

// One work tile's K/V stream as one issuer loads it (the producer: issuer 0; a KV cache's other
// cache_issuers theirs): K of the first key tile, then steps it = 1 .. n_tiles - 1 (K of key tile
// it with V of key tile it - 1, so the next S GEMM can start before the previous P·V has its
// operand), then the last V. Every issuer walks this order, so each full barrier gets all its
// issuers' arrivals. kv: the ring ordinal of the tile's first key tile.
template <class Cfg>
struct TileKvStream {
  SharedStorage<Cfg>& ss;
  const CUtensorMap* tm_k;
  const CUtensorMap* tm_v;
  const ForwardParams& params;
  int kv, n_end, head_kv, batch, k_first_key, v_first_key, seqlen_k, issuer;

  __device__ __forceinline__ void k(int it) const {
    load_kv_tile<Cfg>(ss, tm_k, ss.k, ss.k_full, ss.k_empty, kv + it, n_end - 1 - it, head_kv, batch, k_first_key,
                      &params.kv_pages, seqlen_k, issuer);
  }
  __device__ __forceinline__ void v(int it) const {
    load_kv_tile<Cfg, Cfg::kFp8>(ss, tm_v, ss.v, ss.v_full, ss.v_empty, kv + it, n_end - 1 - it, head_kv, batch,
                                  v_first_key, &params.kv_pages, seqlen_k, issuer);
  }
  __device__ __forceinline__ void step(int it) const {
    k(it);
    v(it - 1);
  }
  // The tile's steps from `from` on (the steady loop), then its last V: what the producer and each cache issuer do once a tile's first steps are out.
  __device__ __forceinline__ void rest(int from, int n_tiles) const {
    for (int it = from; it < n_tiles; ++it) step(it);
    v(n_tiles - 1);
  }
};

// Walks the same tiles as the consumers. The K/V ring ordinal and the Q phase run on across
// tiles (phases are never reset); a tile without visible keys loads nothing. The next tile is
// chosen and published once this tile's first loads are out: the tile counter's atomicAdd
// then runs while the consumers still have work, not between two of their tiles.
template <class Cfg>
__device__ __forceinline__ void run_producer(SharedStorage<Cfg>& ss, const CUtensorMap* tm_q,
                                             const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                             const ForwardParams& params) {
  using namespace ptx;
  int kv = 0;      // K/V tiles loaded so far
  int q_iter = 0;  // Q tiles loaded so far
  TileChooser chooser(whole_tiles<Cfg>(params));
  ScheduledTile w = schedule_tile<Cfg>(chooser, params);
  if constexpr (Cfg::kKvCache) trace_kv(params, kTraceFirstTile);
  // Only a packed batch's grid can start past its tiles (it is sized before they are counted).
  if (Cfg::kVarlen && w.is_end()) chooser.retire(params);
  ss.tiles.publish(0, w);
  for (int i = 0; !w.is_end(); ++i) {
    const int n_tiles = w.n_tiles, n_end = w.n_end;  // key tiles n_end - 1 down to n_end - n_tiles
    const int head_kv = w.head / params.kv_group;
    // A packed batch's tensor maps have one batch entry; a KV cache's q keeps its batch axis.
    const int batch = Cfg::kVarlen && !Cfg::kKvCache ? 0 : w.batch;
    const int seqlen_k = w.seqlen_k;  // (KV caches: the boxes past it are zero-filled)
    // FP8's Vᵀ keeps each sequence's keys from its padded row (quantize_fp8_varlen), K at the
    // caller's offset.
    const int v_first_key = Cfg::kFp8 && Cfg::kVarlen ? static_cast<int>(varlen_row0(w.k_offset, w.batch)) : w.k_offset;
    const TileKvStream<Cfg> stream{ss, tm_k, tm_v, params, kv, n_end, head_kv, batch, w.k_offset, v_first_key,
                                   seqlen_k, 0};
    int it0 = 1;  // the tile's first step loaded in the loop below
    if (n_tiles > 0) {
      // The first K tile can go into a ring slot freed during the previous tile; Q must wait
      // until both consumers' last S GEMM of the tile that used its buffer has read it.
      stream.k(0);
      if constexpr (Cfg::kKvCache)
        if (i == 0) trace_kv(params, kTraceFirstLoad);
      if constexpr (Cfg::kEarlyKv) {
        if (kv == 0) {
          // The CTA's first tile with keys (kv is 0 until then): every ring slot is still free,
          // so the loop's first steps go out before Q without waiting on one, in the cache
          // issuers' order; then Q, once its quantisation has finished.
          for (; it0 < n_tiles && it0 < Cfg::kStages; ++it0) stream.step(it0);
          ptx::wait_for_preceding_grid();
        }
      }
      const RingSlot qs = ring_slot<Cfg::kQStages>(q_iter);
      mbarrier_wait(smem_addr(&ss.q_empty[qs.stage]), qs.phase ^ 1);
      const uint32_t q_bar = smem_addr(&ss.q_full[qs.stage]);
      if constexpr (Cfg::kKvCache) {
        load_packed_q<Cfg>(smem_addr(ss.q[qs.stage]), tm_q, q_bar, first_row_of_block<Cfg>(w.m_block, params), w.head,
                           batch, params.packing);
      } else {
        mbarrier_arrive_expect_tx(q_bar, Cfg::kQTileBytes);
        load_panel_tile<Cfg::kPanels, Cfg::kBlockM, Cfg::kSwizzleBytes, Cfg::kFp8>(
            smem_addr(ss.q[qs.stage]), tm_q, q_bar, w.q_offset + w.m_block * Cfg::kBlockM, w.head, batch);
      }
    }
    chooser.advance<!Cfg::kCausal>(params);
    const ScheduledTile next = schedule_tile<Cfg>(chooser, params);
    ss.tiles.publish(i + 1, next);
    if constexpr (Cfg::kKvCache)
      if (i == 0) trace_kv(params, kTraceFirstPublish);
    if (n_tiles > 0) {
      stream.rest(it0, n_tiles);
      if constexpr (Cfg::kKvCache) trace_kv(params, kTraceLastLoad);
      kv += n_tiles;
      ++q_iter;
    }
    // A packed batch's tile has eight live fields: the producer of the widest FP8 kernel (24
    // registers) spilled holding them across this tile's loads; it reads them back instead.
    if constexpr (Cfg::kVarlen)
      w = ss.tiles.own(i + 1);
    else
      w = next;
  }
}

// The other issuers of a KV-cache launch's key tiles (cache_issuers > 1: lane 0 of producer
// warps 1 .. issuers - 1): they receive each tile as the consumers do and load their share of
// its K and V boxes in the producer's order (TileKvStream).
template <class Cfg>
__device__ __forceinline__ void run_cache_issuer(SharedStorage<Cfg>& ss, const CUtensorMap* tm_k,
                                                 const CUtensorMap* tm_v, const ForwardParams& params, int issuer) {
  static_assert(Cfg::kKvCache, "a KV cache's issuer");
  int kv = 0;
  for (int i = 0;; ++i) {
    const ScheduledTile w = ss.tiles.template receive<true, true>(i);
    if (w.is_end()) break;
    const int n_tiles = w.n_tiles, n_end = w.n_end, head_kv = w.head / params.kv_group;
    if (n_tiles == 0) continue;
    const TileKvStream<Cfg> stream{ss, tm_k, tm_v, params, kv, n_end, head_kv, w.batch, 0, 0, w.seqlen_k, issuer};
    stream.k(0);
    stream.rest(1, n_tiles);
    kv += n_tiles;
  }
}

}  // namespace warpattn::detail
