// Host-side FP8 E4M3 (the OCP "E4M3FN" format that Hopper's QGMMA reads) as raw bytes:
// 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN;
// the largest finite value is 448 (S.1111.110); subnormals go down to 2^-9.
// Conversion rounds to nearest, ties to even, and saturates like PTX cvt.rn.satfinite.e4m3x2:
// magnitudes past 448 (infinity included) become +-448, NaN stays NaN.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace warpattn::host {

inline constexpr float kE4m3Max = 448.f;
inline constexpr uint8_t kE4m3NaN = 0x7F;

inline float e4m3_to_float(uint8_t code) {
  const bool negative = code & 0x80;
  const int exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7)
    return std::nanf("");
  if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
  else
    magnitude = std::ldexp(1.f + mantissa / 8.f, exponent - 7);
  return negative ? -magnitude : magnitude;
}

inline uint8_t float_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | kE4m3NaN;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= kE4m3Max) return sign | 0x7E;  // satfinite (448 itself included)
  // The quantum of a's binade: 2^(e-3) for normal numbers, 2^-9 below 2^-6 (subnormals).
  const int e = a < 0x1p-6 ? -6 : std::ilogb(a);
  const double quantum = std::ldexp(1.0, e - 3);
  const double steps = std::nearbyint(a / quantum);  // default rounding mode: ties to even
  const double r = steps * quantum;                   // may step up into the next binade
  if (r >= kE4m3Max) return sign | 0x7E;
  if (r < 0x1p-6) return sign | static_cast<uint8_t>(steps);  // subnormal (or zero)
  const int re = std::ilogb(r);
  const int mantissa = static_cast<int>(std::ldexp(r, 3 - re)) - 8;
  return sign | static_cast<uint8_t>(((re + 7) << 3) | mantissa);
}

}  // namespace warpattn::host
