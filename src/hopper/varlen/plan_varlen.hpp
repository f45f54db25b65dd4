// The plan of a packed batch's work tiles (varlen_tiles.hpp), made on the device from the
// sequence offsets without a host synchronisation: two small kernels enqueued before the
// attention kernel on the same stream.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "hopper/varlen/varlen_tiles.hpp"

namespace warpattn::detail {

// Where the attention kernel finds the plan: tiles[0 .. *tile_count).
struct VarlenPlan {
  const VarlenTile* tiles = nullptr;
  const int* tile_count = nullptr;
};

// Bytes of device memory the plan takes for `batch` sequences and a table of max_tiles
// entries (max_varlen_tiles).
size_t varlen_plan_bytes(int batch, long long max_tiles);

// Enqueues the planning kernels on `stream` (the current device's), writing into `workspace`
// (varlen_plan_bytes bytes, 16-byte aligned); the plan is ready for work enqueued after it.
VarlenPlan plan_varlen_tiles(const VarlenSequences& seqs, const VarlenGeometry& g, long long max_tiles,
                             void* workspace, cudaStream_t stream);

}  // namespace warpattn::detail
