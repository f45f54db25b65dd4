// Device properties the launch needs, queried once per device.
#pragma once

namespace warpattn::detail {

// Streaming multiprocessors of the current device.
int multiprocessor_count();

}  // namespace warpattn::detail
