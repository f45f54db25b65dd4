// TMA tensor maps over (batch, seqlen, heads, head_dim) tensors.
#pragma once
#include <cuda.h>

#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

// Describes t as the 5-D tensor {64, seqlen, head_dim / 64, heads, batch} (innermost first):
// the head dim is split into 64-element panels, so one box {64, box_rows, box_panels, 1, 1}
// lands in shared memory as [panel][row][128 B], 128B-swizzled — the layout wgmma reads.
// Rows past seqlen are zero-filled on load and dropped on store.
CUtensorMap make_panel_tensor_map(const TensorView& t, const char* name, int box_rows,
                                  int box_panels);

}  // namespace warpattn::detail
