// Where a KV cache keeps a sequence's keys (issue 16; warpattn.hpp, KvCache): which page and
// row of the cache's tensor map hold key `key` of sequence `batch`, as the forward kernel's
// producer loads a key tile in boxes of box_rows keys. Host-and-device, so the CPU tests check
// it against the layout's definition.
//
// The cache's tensor map is the 5-D panel map of a (pages, page rows, Hkv, D) tensor (tensor_map.hpp):
//  * dense (B, S_cache, Hkv, D): page = the sequence, one box of the whole key tile;
//  * paged (num_pages, page_size, Hkv, D): page = block_table[batch][key / page_size], boxes of
//    box_rows keys, the largest power of two that divides both the page size and the key tile,
//    so that every box lies in one page. Any page size: below 8 keys a box is less than a
//    swizzle atom (8 rows of 128 bytes), which TMA and wgmma both take from the absolute shared
//    address (HOPPER-PRIMER section 2.3, measured), so boxes of 1..4 rows compose the same
//    swizzled tile as one box would; the cost is the boxes' count (a 128-key tile of pages of
//    one key is 128 boxes per panel).
// A box that starts at or past the sequence's length, or whose page index is outside the
// cache, is loaded from page -1: outside the tensor, so TMA fills it with zeros and reads
// nothing. Past the length its keys are masked; inside it (a broken block table) they are keys
// of zeros (score 0, value 0): a wrong result for that sequence, never a read outside the cache.
#pragma once
#include <cstdint>

#include "hopper/host_device.hpp"

namespace warpattn::detail {

struct KvPages {
  const int* table = nullptr;  // (B, max_pages) block table, or null: a dense cache
  int64_t table_stride = 0;    // between sequences' rows of the table, in entries
  int num_pages = 0;           // pages of the cache (dense: B)
  int page_size = 0;           // keys per page (paged)
  int box_rows = 0, boxes = 1;  // a key tile is `boxes` boxes of box_rows keys
  bool l2_evict_first = false;  // the boxes load under an L2 evict-first policy (decode_plan.hpp's cache_evict_first)
};

// How many producer threads issue a KV-cache key tile's boxes: one for a tile of one box, up to
// kCacheIssuers (lane 0 of each producer warp) for more; boxes is a power of two, so they share
// them evenly (issuer i the boxes i, i + issuers, ...). Run 141: pages of 16 (8 boxes a tile,
// each after its block-table load, from one thread) took 1.7x the dense cache's time.
inline constexpr int kCacheIssuers = 4;
WARPATTN_HOST_DEVICE int cache_issuers(const KvPages& kv) { return kv.boxes < kCacheIssuers ? kv.boxes : kCacheIssuers; }

struct CacheBox {
  int page, row;  // the box's coordinates in the cache's map (page -1: zero-filled)
};

WARPATTN_HOST_DEVICE CacheBox cache_box(const KvPages& kv, int batch, int key, int seqlen_k) {
  if (key >= seqlen_k) return {-1, 0};
  if (kv.table == nullptr) return {batch, key};
  const int slot = key / kv.page_size;  // inside the table's row: seqlen_k is clamped to the capacity
  const int page = kv.table[batch * kv.table_stride + slot];
  if (page < 0 || page >= kv.num_pages) return {-1, 0};
  return {page, key - slot * kv.page_size};
}

// The box height for a key tile of block_n keys over pages of page_size keys (paged), or the
// whole tile (dense: page_size <= 0): the largest power of two dividing both.
WARPATTN_HOST_DEVICE int cache_box_rows(int block_n, int page_size) {
  if (page_size <= 0) return block_n;
  const int tile_pow2 = block_n & -block_n;  // the largest power of two dividing block_n
  const int page_pow2 = page_size & -page_size;
  return page_pow2 < tile_pow2 ? page_pow2 : tile_pow2;
}

}  // namespace warpattn::detail
