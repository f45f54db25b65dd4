// Which head-dim columns of dK, dV and dQ a backward consumer owns.
//   d <= 128: all of them (dQ's piece is picked by the consumer index instead)
//   d = 256:  consumer c owns columns 128c .. 128c + 127 (Cfg::kSplitHeadDim)
//   d = 512:  two CTAs per key block (Cfg::kColumnHalves), CTA h = blockIdx.x % 2 owning
//             columns 256h ..; its consumer c columns 256h + 128c .. 256h + 128c + 127
// Both CTAs of a key block compute the same S, P, dP and dS (each over all 512 columns), and
// each writes only its own columns of dK, dV and dQ: disjoint, so neither waits for the other.
#pragma once

namespace warpattn::detail {

template <class Cfg>
__device__ __forceinline__ int column_half() {
  if constexpr (Cfg::kColumnHalves > 1)
    return static_cast<int>(blockIdx.x % Cfg::kColumnHalves);
  else
    return 0;
}

// The first of the kKVColumns columns consumer `warpgroup` owns (0 without a split head dim).
template <class Cfg>
__device__ __forceinline__ int consumer_column0(int warpgroup) {
  if constexpr (!Cfg::kSplitHeadDim)
    return 0;
  else if constexpr (Cfg::kColumnHalves > 1)
    return column_half<Cfg>() * Cfg::kCtaColumns + warpgroup * Cfg::kKVColumns;
  else
    return warpgroup * Cfg::kKVColumns;
}

}  // namespace warpattn::detail
