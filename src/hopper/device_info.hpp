// Device properties the launch needs, queried once per device.
#pragma once

namespace warpattn::detail {

// Streaming multiprocessors of the current device.
int multiprocessor_count();

// Bytes of L2 cache of the current device.
int l2_cache_bytes();

}  // namespace warpattn::detail
