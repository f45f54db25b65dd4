// Host-side conversions between float and the 16-bit formats the kernels read and write, as raw
// bit patterns. The tests build fp16/bf16 inputs with these and read the GPU's outputs back, so
// they follow IEEE 754 exactly: round to nearest, ties to even; overflow to infinity; NaN stays
// NaN (made quiet); fp16 subnormals are produced and read, not flushed.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace warpattn::host {

// bfloat16 is the upper half of a float32, so conversion is a rounding of the low 16 bits.
inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: truncating could clear every mantissa bit and turn it into infinity, so keep the
    // sign and top payload bits and set the quiet bit.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7FFF rounds up exactly when the low half exceeds one half; the extra 1 from the
  // lowest kept bit makes an exact half round up only when that bit is odd (ties to even).
  // A carry out of the mantissa bumps the exponent, which turns values past the largest
  // bfloat16 into infinity, as IEEE rounding requires.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

// Rounds `magnitude` (an integer mantissa) right by `shift` bits, ties to even.
inline uint32_t shift_right_round_even(uint32_t magnitude, int shift) {
  const uint32_t kept = magnitude >> shift;
  const uint32_t rest = magnitude & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

// fp16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits; largest finite 65504,
// smallest normal 2^-14, smallest subnormal 2^-24.
inline uint16_t float_to_f16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;

  if (magnitude > 0x7F800000u)  // NaN: quiet, keeping the top payload bits
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x03FFu));
  // 65520 (0x477FF000) is halfway between 65504 and 2^16; the tie goes to the even neighbour,
  // 2^16, which does not exist, so it and everything above become infinity (as does inf).
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);

  if (magnitude >= 0x38800000u) {  // normal in fp16 (>= 2^-14)
    // Rebias the exponent from 127 to 15 in place, then drop 13 mantissa bits with rounding; a
    // carry out of the mantissa correctly moves to the next exponent.
    const uint32_t rebiased = magnitude - ((127u - 15u) << 23);
    return static_cast<uint16_t>(sign | shift_right_round_even(rebiased, 13));
  }

  // Subnormal in fp16: the result is round(|f| / 2^-24). With the implicit bit made explicit,
  // |f| = mantissa * 2^(exponent - 150), so the result is mantissa >> (126 - exponent).
  const int exponent = static_cast<int>(magnitude >> 23);
  const int shift = 126 - exponent;
  // Below 2^-25 (shift > 24) the value is under half the smallest subnormal: rounds to zero.
  // This also covers float subnormals and zero (exponent 0).
  if (shift > 24) return sign;
  const uint32_t mantissa = (magnitude & 0x007FFFFFu) | 0x00800000u;
  // Rounding up from 0x3FF yields 0x400, the encoding of the smallest normal: also correct.
  return static_cast<uint16_t>(sign | shift_right_round_even(mantissa, shift));
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x03FFu;
  if (exponent == 0x1F)  // infinity or NaN, payload kept
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 127u - 15u) << 23) | (mantissa << 13));
}

}  // namespace warpattn::host
