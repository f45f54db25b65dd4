// An E4M3 cache step's Q (issue 16; docs/decode-fp8-cache-design.md, decision (a)): FP8 wgmma
// multiplies E4M3 by E4M3, so the step's 16-bit q is quantised first, with one descale per work
// tile of the KV-cache kernel (a block of packing.positions positions x one chunk of
// packing.heads query heads of a sequence: for a decode step, the GQA group of one KV head), as
// the consumers read it (q_descale.at(batch, chunk, block of positions)). Not rotated (the
// first version: no incoherent processing on the cache; the cache's K is not rotated either).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "hopper/decode/decode_plan.hpp"
#include "warpattn/warpattn.hpp"

namespace warpattn::detail {

// q (B, Sq, Hq, D) 16-bit -> codes (B, Sq, Hq, D) e4m3, contiguous, and descales (B, Hq /
// packing.heads, ceil(Sq / packing.positions)) fp32, contiguous: descale = amax / 448 of the
// tile (1 for a tile of zeros; NaNs ignored, their codes NaN), code = e4m3(x / descale),
// rounded to nearest even, saturated to +-448.
void quantize_cache_q(const TensorView& q, void* codes, float* descales, const GqaPacking& packing,
                      cudaStream_t stream);

}  // namespace warpattn::detail
