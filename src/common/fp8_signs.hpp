// The random +-1 diagonal of FP8's incoherent processing, one sign per head-dim element,
// drawn from a seed with splitmix64. Shared by the GPU pass and the CPU reference so that
// both rotate by the very same matrix.
#pragma once
#include <cstdint>

namespace warpattn {

// True when element i of the diagonal is -1.
inline bool fp8_sign_is_negative(uint64_t seed, int i) {
  uint64_t z = seed + static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64, step i + 1
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (z & 1) == 0;
}

}  // namespace warpattn
