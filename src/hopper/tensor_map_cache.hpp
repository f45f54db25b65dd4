// The last few tensor maps a thread encoded, so that a call repeating an earlier call's tensors
// (the same address, shape, strides and box: every decode step, every layer of a model run in a
// loop) takes its maps from here instead of cuTensorMapEncodeTiled (issue 16's host cost: three
// to five encodes per call). A map describes addressing only (base address, dims, strides, box,
// swizzle), never the contents, so a hit is exactly the map the encoder would return: a new
// allocation at the same address with the same layout is described by it correctly too.
// Thread-local, so no locks; a miss evicts round-robin. Failed encodes are not kept.
#pragma once

#include <cudaTypedefs.h>

#include <cstdint>
#include <cstring>

namespace warpattn::detail {

// Everything cuTensorMapEncodeTiled is given that can vary between our calls.
struct TensorMapKey {
  const void* data = nullptr;
  uint64_t dims[5] = {};
  uint64_t strides[4] = {};
  uint32_t box[5] = {};
  int32_t type = 0;
  int32_t swizzle = 0;

  bool operator==(const TensorMapKey& o) const {
    return data == o.data && type == o.type && swizzle == o.swizzle &&
           std::memcmp(dims, o.dims, sizeof dims) == 0 && std::memcmp(strides, o.strides, sizeof strides) == 0 &&
           std::memcmp(box, o.box, sizeof box) == 0;
  }
};

template <int kEntries>
class TensorMapCache {
 public:
  // The map for `key`: a kept one, or encode(key) (which may throw: nothing is kept then).
  template <class Encode>
  CUtensorMap get(const TensorMapKey& key, Encode&& encode) {
    for (int i = 0; i < used_; ++i)
      if (keys_[i] == key) return maps_[i];
    const CUtensorMap map = encode(key);
    int slot = used_;
    if (used_ < kEntries) {
      ++used_;
    } else {
      slot = next_victim_;
      next_victim_ = (next_victim_ + 1) % kEntries;
    }
    keys_[slot] = key;
    maps_[slot] = map;
    return map;
  }

 private:
  TensorMapKey keys_[kEntries];
  CUtensorMap maps_[kEntries];
  int used_ = 0, next_victim_ = 0;
};

}  // namespace warpattn::detail
