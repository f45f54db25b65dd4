// One tile of a (batch, seqlen, heads, head_dim) tensor through its panel map
// (tensor_map.hpp) into shared memory as [panel][row][panel bytes], the layout wgmma reads.
//
// A 16-bit tensor's map is {head_dim, seqlen, 1, heads, batch} with one-panel boxes, loaded one
// panel at a time at the panel's first column. That serves every head dim with one code path:
// a head dim between compiled ones (72 in the 128 kernel, say) has no whole last panel, and TMA
// zero-fills the columns past head_dim (whole panels past it too), which adds nothing to Q·Kᵀ
// and gives P·V zero columns that the epilogue does not write. The box bytes of the whole tile
// arrive either way (complete_tx counts out-of-bounds fill). (A runtime choice between this and
// one box of every panel spilled the backward's 24-register producer.) FP8's tensors (kWholeBox)
// keep one box of every panel: their head dims are always compiled ones.
#pragma once
#include <cstdint>

#include "hopper/ptx/tma.cuh"

namespace warpattn::detail {

template <int kPanels, int kRows, int kPanelBytes, bool kWholeBox = false>
__device__ __forceinline__ void load_panel_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row, int head,
                                                int batch) {
  if constexpr (kWholeBox) {
    ptx::tma_load_5d(dst, map, bar, 0, row, 0, head, batch);
  } else {
#pragma unroll
    for (int p = 0; p < kPanels; ++p)  // 16-bit elements: kPanelBytes / 2 columns a panel
      ptx::tma_load_5d(dst + p * kRows * kPanelBytes, map, bar, p * (kPanelBytes / 2), row, 0, head, batch);
  }
}

}  // namespace warpattn::detail
