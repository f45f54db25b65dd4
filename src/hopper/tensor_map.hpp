// TMA tensor maps over (batch, seqlen, heads, head_dim) tensors.
#pragma once
#include <cuda.h>

#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

// Describes t as the 5-D tensor {64, seqlen, head_dim / 64, heads, batch} (innermost first):
// the head dim is split into 64-element panels, so one box {64, box_rows, box_panels, 1, 1}
// lands in shared memory as [panel][row][128 B], 128B-swizzled — the layout wgmma reads.
// Rows past seqlen are zero-filled on load and dropped on store.
// panel_bytes generalises the 128-byte panel: FP8 e4m3 tensors use 128-element panels, and
// at d = 64 one 64-byte panel per row, 64B-swizzled ({64, seqlen, 1, heads, batch}).
// 16-bit tensors get {head_dim, seqlen, 1, heads, batch} with one-panel boxes instead (box_panels
// unused): load_panel_tile (panel_tile.cuh) loads them a panel at a time, so that a head dim
// between compiled ones has the columns past it zero-filled.
CUtensorMap make_panel_tensor_map(const TensorView& t, const char* name, int box_rows,
                                  int box_panels, int panel_bytes);
// A KV cache launch's q (B, Sq, Hq, D), 16-bit, with its rows packed (decode_plan.hpp,
// GqaPacking): {head_dim, heads of a chunk, seqlen, chunks, batch}, boxes of one panel x
// `heads` x `positions`, landing as rows position x heads + head of the panel.
CUtensorMap make_packed_q_tensor_map(const TensorView& q, const char* name, int heads, int positions, int panel_bytes);


// FP8's Vᵀ (batch, heads, head_dim, keys) as {keys, head_dim, 1, heads, batch}: one box
// {box_keys (128 = one 128-byte panel), head_dim, 1, 1, 1} lands as [d][128 B], 128B-swizzled,
// the K-major B operand of the P·V GEMM. Keys past the tensor are zero-filled.
CUtensorMap make_vt_tensor_map(const TensorView& vt, const char* name, int box_keys);

// An E4M3 KV cache's Vᵀ pages in 16-key slices (pages, heads, page_keys / 16, 16 head_dim)
// (decode/fp8_cache_layout.hpp; a dense cache: one page per sequence), no swizzle, as {128
// bytes, head_dim / 8, slices, heads, pages}: a box of box_keys keys (a multiple of 16 dividing
// page_keys or past its end) lands as box_keys / 16 slices of head_dim rows x 16 bytes, wgmma's
// no-swizzle K-major layout (KvCacheConfig's kVtSlices), in rows of 128 bytes. Slices past the
// page are zero-filled.
CUtensorMap make_vt_slices_tensor_map(const TensorView& vt, const char* name, int box_keys);

}  // namespace warpattn::detail
