// The head-dim-128 backward's query rows per step, a compile-time knob for an A/B, and what the
// workspace's row padding has to be for it (host-and-device, so the CPU tests see the same).
//   WARPATTN_TUNE_BWD_BLOCK_M          the non-banded kernels' kBlockM at d = 128: 80 (default;
//                                      FlashAttention-3's d = 128 tile, dQ computed transposed:
//                                      docs/backward-design.md; +6.0% over 64 on the H200, run
//                                      163) or 64
//   WARPATTN_TUNE_BWD_BLOCK_M_CAUSAL   the banded kernels' (causal or a window): 80 (default;
//                                      +5.3% over 64 causal on the H200, run 168) or 64;
//                                      FA3 keeps 64 there
// Two knobs of one flag each, so that scripts/ab_fp8.sh (whose variants are NAME=FLAG words) can
// time them apart. d = 64 (128 rows) and d = 256 (64 rows) do not depend on them.
#pragma once

#include "hopper/host_device.hpp"

#ifndef WARPATTN_TUNE_BWD_BLOCK_M
#define WARPATTN_TUNE_BWD_BLOCK_M 80
#endif
#ifndef WARPATTN_TUNE_BWD_BLOCK_M_CAUSAL
#define WARPATTN_TUNE_BWD_BLOCK_M_CAUSAL 80
#endif

namespace warpattn::detail {

inline constexpr int kBackwardD128BlockM = WARPATTN_TUNE_BWD_BLOCK_M;
inline constexpr int kBackwardD128CausalBlockM = WARPATTN_TUNE_BWD_BLOCK_M_CAUSAL;
static_assert(kBackwardD128BlockM == 64 || kBackwardD128BlockM == 80, "WARPATTN_TUNE_BWD_BLOCK_M: 64 or 80");
static_assert(kBackwardD128CausalBlockM == 64 || kBackwardD128CausalBlockM == 80,
              "WARPATTN_TUNE_BWD_BLOCK_M_CAUSAL: 64 or 80");
// 96 does not fit: Q, dO and dS double-buffered at 96 rows (3 x 2 x 24 KB) with K, V (64 KB) and
// the 48 KB of dQ pieces are 256 KB of shared memory, and dK + dV (128) + Sᵀ and dPᵀ (96) leave
// 16 of the 240 registers for everything else.

// The workspace's rows per (batch, head) are a multiple of this, and a packed batch's sequences
// start at multiples of it (workspace.hpp): a multiple of every query block the kernel of that
// head dim walks (64 or 80 rows) and of the row kernels' 64-row blocks, so that no block of
// either spans two sequences or runs past the rows. 128 as before; 320 = lcm(64, 80) with a
// knob at 80 (the 512 kernel's 32-row blocks: 128). kernel_head_dim: 64, 128, 256 or 512.
WARPATTN_HOST_DEVICE constexpr int backward_row_granule(int kernel_head_dim) {
  return kernel_head_dim == 128 && (kBackwardD128BlockM == 80 || kBackwardD128CausalBlockM == 80) ? 320 : 128;
}
// Query rows per deterministic turn counter (workspace.hpp's turns): 64, one per 64-row block
// (an 80-row block uses the one at its first row / 80: fewer); 32 for the 512 kernel, whose
// query blocks are 32 rows, each with its own counter.
WARPATTN_HOST_DEVICE constexpr int backward_turn_rows(int kernel_head_dim) { return kernel_head_dim == 512 ? 32 : 64; }
inline constexpr int kBackwardMaxRowGranule = 320;  // of any build (validate.cpp's overflow bound)

}  // namespace warpattn::detail
