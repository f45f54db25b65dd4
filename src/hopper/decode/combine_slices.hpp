// Which part of a KV-cache tile's partial states one CTA of combine_kvcache_splits_kernel adds
// (decode/combine_splits.cuh): host-and-device, so the CPU tests check it against the layout
// the consumers store (tests/cpu/test_decode_plan.cpp).
//
// A tile's slot holds one part per consumer warpgroup (split_tail_combine.cuh's PartialState:
// part w is warpgroup w's O registers, o_cols columns of its rows, then its rows' {R, l}). Where
// each warpgroup has rows of its own (64 each), part w is rows 64 w .. 64 w + 63, all columns;
// where they share the tile's 64 rows (ForwardConfig::kSharedRows, the split head dim at 512),
// part w is columns [w o_cols, (w + 1) o_cols) of those rows, both parts with the same {R, l}.
// The combine's grid is (tiles, row groups, head_dim / kCombineSliceCols): each CTA adds 32
// columns of one row group, from the part that holds them.
#pragma once

#include "hopper/host_device.hpp"

namespace warpattn::detail {

inline constexpr int kCombineSliceCols = 32;  // a combine CTA's columns: four float4 groups

// The combine grid's row groups (its blockIdx.y extent): one per warpgroup whose rows (64 each)
// hold a stored row, or one for shared rows. tile_rows: the most rows a tile stores (a KV-cache
// tile's are its first: packed positions x heads), so a one-row decode step of a few heads
// a KV head launches no CTA that would only find warpgroup 1's padding.
WARPATTN_HOST_DEVICE constexpr int combine_row_groups(int warpgroups, bool shared_rows, int tile_rows) {
  const int holding = (tile_rows + 63) / 64;
  return shared_rows || holding < 1 ? 1 : holding < warpgroups ? holding : warpgroups;
}

// CTA (row_group, slice): the warpgroup whose rows it stores (epilogue.cuh's row places), the
// state part it reads, and that part's first float4 group (fragment registers 4 g .. 4 g + 3:
// columns 8 g .. 8 g + 7 of the part's o_cols). Its columns in the head dim are always
// slice x kCombineSliceCols.
struct CombineSlice {
  int rows_warpgroup, part, first_group;
};
WARPATTN_HOST_DEVICE constexpr CombineSlice combine_slice(int row_group, int slice, int o_cols, bool shared_rows) {
  constexpr int kGroups = kCombineSliceCols / 8;
  if (!shared_rows) return {row_group, row_group, slice * kGroups};
  const int per_part = o_cols / kCombineSliceCols;
  return {0, slice / per_part, slice % per_part * kGroups};
}

}  // namespace warpattn::detail
