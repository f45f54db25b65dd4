// The float 1.5·2²³ and integers. Floats in [2²³, 2²⁴) are spaced exactly 1 apart, so
//  * x + 1.5·2²³ rounds any |x| < 2²² to an integer (ties to even) and leaves it, two's
//    complement, in the low mantissa bits (FP8's INT8 quantisation reads the low byte);
//  * adding the bits 0x4B400000 to a small int32 i gives the float 1.5·2²³ + i exactly (the
//    INT8 Q/K kernel's scores become floats with one integer add).
#pragma once

namespace warpattn {

inline constexpr float kMagicIntFloat = 12582912.f;  // 1.5·2²³
inline constexpr int kMagicIntFloatBits = 0x4B400000;

}  // namespace warpattn
