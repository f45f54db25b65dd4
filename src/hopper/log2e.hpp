// log2(e): the kernels take exponentials as exp2, so scores and log-sum-exps are scaled by it.
#pragma once

namespace warpattn::detail {

inline constexpr double kLog2e = 1.4426950408889634;

}  // namespace warpattn::detail
