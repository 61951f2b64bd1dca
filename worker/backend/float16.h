// Conversions between float and the two 16-bit floating-point formats a
// Buffer may hold, as raw bits: IEEE 754 binary16 ("float16", half) and
// bfloat16 (the top half of a float32). float -> 16 bits rounds to nearest,
// ties to even, like hardware conversions; 16 bits -> float is exact. NaNs
// stay NaNs (quiet), infinities and signed zeros are kept, float16
// subnormals are handled. Header-only so that reduction loops inline them.
#ifndef GRADSYNC_WORKER_BACKEND_FLOAT16_H_
#define GRADSYNC_WORKER_BACKEND_FLOAT16_H_

#include <cstdint>
#include <cstring>

namespace gradsync {

inline uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// binary16 -> float, exact.
inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // infinity, or NaN (mantissa kept)
    return FloatFromBits(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {  // normal: rebias 15 -> 127
    return FloatFromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  return FloatFromBits(sign |
                       FloatBits(static_cast<float>(mantissa) * 0x1p-24f));
}

// float -> binary16, rounding to nearest, ties to even; overflows to
// infinity.
inline uint16_t FloatToFloat16(float f) {
  const uint32_t bits = FloatBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // infinity or NaN (made quiet)
    return static_cast<uint16_t>(
        sign | 0x7c00u |
        (magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu) : 0u));
  }
  // 65520 (halfway between 65504, the largest float16, and 2^16) and up.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude >= 0x38800000u) {  // 2^-14 and up: a normal float16
    // Round away the 13 low mantissa bits; a carry moves into the exponent.
    magnitude += 0xfffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((magnitude - (112u << 23)) >> 13));
  }
  // At most 2^-25 (half the smallest subnormal, a tie to even): zero.
  if (magnitude <= 0x33000000u) return static_cast<uint16_t>(sign);
  // A subnormal: the 24-bit significand shifted to units of 2^-24. A carry
  // out of the subnormal range gives 0x400, the smallest normal: correct.
  const uint32_t exponent = magnitude >> 23;  // 102 .. 112
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14 .. 24
  uint32_t units = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (units & 1u))) ++units;
  return static_cast<uint16_t>(sign | units);
}

// bfloat16 -> float, exact.
inline float BFloat16ToFloat(uint16_t b) {
  return FloatFromBits(static_cast<uint32_t>(b) << 16);
}

// float -> bfloat16, rounding to nearest, ties to even; overflows to
// infinity.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it NaN, quiet
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_FLOAT16_H_
