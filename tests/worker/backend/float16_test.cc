// Tests of the float16 and bfloat16 conversions: every 16-bit pattern to
// float, and float to 16 bits at and around every rounding boundary, against
// the compiler's own _Float16 (binary16) and a reference by distances
// computed in double (bfloat16).
#include "worker/backend/float16.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

#if defined(__FLT16_MAX__)
constexpr bool kHaveFloat16 = true;
uint16_t ReferenceToFloat16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}
float ReferenceFromFloat16(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof(bits));
  return static_cast<float>(h);
}
#else
constexpr bool kHaveFloat16 = false;
uint16_t ReferenceToFloat16(float) { return 0; }
float ReferenceFromFloat16(uint16_t) { return 0; }
#endif

bool IsFloat16NaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
bool IsBFloat16NaN(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

// Compares FloatToFloat16(f) with the compiler's conversion; NaNs need only
// stay NaNs of the same sign.
void ExpectFloat16Of(float f) {
  const uint16_t got = FloatToFloat16(f);
  const uint16_t want = ReferenceToFloat16(f);
  if (std::isnan(f)) {
    EXPECT_TRUE(IsFloat16NaN(got)) << std::hex << FloatBits(f);
    EXPECT_EQ(got & 0x8000, want & 0x8000);
    return;
  }
  EXPECT_EQ(got, want) << "float bits 0x" << std::hex << FloatBits(f) << " ("
                       << f << ")";
}

TEST(Float16Test, EveryFloat16ConvertsToFloatExactly) {
  if (!kHaveFloat16) GTEST_SKIP() << "the compiler has no _Float16";
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float got = Float16ToFloat(static_cast<uint16_t>(h));
    const float want = ReferenceFromFloat16(static_cast<uint16_t>(h));
    if (IsFloat16NaN(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    EXPECT_EQ(FloatBits(got), FloatBits(want)) << "float16 0x" << std::hex << h;
    // And back, unchanged.
    EXPECT_EQ(FloatToFloat16(got), h) << "float16 0x" << std::hex << h;
  }
}

// Every float16 value, the midpoint between it and the next one (a tie),
// and the floats just either side of the midpoint: covers rounding up, down,
// ties to even, carries into the exponent, subnormals and overflow.
TEST(Float16Test, FloatRoundsToNearestEvenAtEveryBoundary) {
  if (!kHaveFloat16) GTEST_SKIP() << "the compiler has no _Float16";
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const double low = Float16ToFloat(static_cast<uint16_t>(h | sign));
      // Past the largest float16 the next value would be 2^16.
      const double high =
          h + 1 == 0x7c00
              ? (sign ? -65536.0 : 65536.0)
              : Float16ToFloat(static_cast<uint16_t>((h + 1) | sign));
      const float mid = static_cast<float>((low + high) / 2);  // exact
      ASSERT_EQ(static_cast<double>(mid), (low + high) / 2);
      ExpectFloat16Of(static_cast<float>(low));
      ExpectFloat16Of(mid);
      ExpectFloat16Of(std::nextafter(mid, 0.0f));
      ExpectFloat16Of(std::nextafter(mid, mid * 2));
    }
  }
}

TEST(Float16Test, RandomFloatsMatchTheCompiler) {
  if (!kHaveFloat16) GTEST_SKIP() << "the compiler has no _Float16";
  std::mt19937 random(20240601);
  for (int i = 0; i < 2'000'000; ++i) {
    ExpectFloat16Of(FloatFromBits(static_cast<uint32_t>(random())));
  }
}

TEST(Float16Test, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToFloat16(0.0f), 0x0000);
  EXPECT_EQ(FloatToFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFloat16(inf), 0x7c00);
  EXPECT_EQ(FloatToFloat16(-inf), 0xfc00);
  EXPECT_TRUE(IsFloat16NaN(FloatToFloat16(std::nanf(""))));
  // A signalling NaN whose payload lies in the bits float16 drops stays NaN.
  EXPECT_TRUE(IsFloat16NaN(FloatToFloat16(FloatFromBits(0x7f800001))));
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7bff);  // largest
  EXPECT_EQ(FloatToFloat16(65519.0f), 0x7bff);  // below the midpoint
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7c00);  // the tie goes to even: inf
  EXPECT_EQ(FloatToFloat16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFloat16(0x1p-25f), 0x0000);  // tie: to even, zero
  EXPECT_EQ(FloatToFloat16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(FloatToFloat16(0x1.8p-24f), 0x0002);    // 1.5 units: tie to even
  EXPECT_EQ(FloatToFloat16(0x1.ff8p-15f), 0x03ff);  // largest subnormal
  EXPECT_EQ(FloatToFloat16(0x1.ffcp-15f), 0x0400);  // tie: carries to normal
  EXPECT_EQ(FloatToFloat16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFloat16(1.0f + 0x1p-11f), 0x3c00);    // tie to even
  EXPECT_EQ(FloatToFloat16(1.0f + 0x1.8p-10f), 0x3c02);  // tie to even, up
  EXPECT_EQ(Float16ToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(Float16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Float16ToFloat(0xfc00), -inf);
  EXPECT_TRUE(std::isnan(Float16ToFloat(0x7e00)));
}

// bfloat16 -> float is exact, and its value as a double: a bfloat16 with an
// all-ones exponent and no mantissa stands for 2^128 in rounding (the value
// past the largest finite one).
double RoundingValue(uint16_t b) {
  if ((b & 0x7fff) == 0x7f80) return (b & 0x8000) ? -0x1p128 : 0x1p128;
  return BFloat16ToFloat(b);
}

// The nearest bfloat16 to finite `f`, ties to even, by distances in double.
uint16_t ReferenceToBFloat16(float f) {
  const uint16_t low = static_cast<uint16_t>(FloatBits(f) >> 16);  // toward 0
  const uint16_t high = static_cast<uint16_t>(low + 1);  // away from 0
  const double below = std::fabs(f - RoundingValue(low));
  const double above = std::fabs(RoundingValue(high) - f);
  if (below < above) return low;
  if (above < below) return high;
  return (low & 1) ? high : low;
}

TEST(BFloat16Test, EveryBFloat16ConvertsToFloatAndBack) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    EXPECT_EQ(FloatBits(f), b << 16);
    if (IsBFloat16NaN(static_cast<uint16_t>(b))) {
      EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(f))) << std::hex << b;
    } else {
      EXPECT_EQ(FloatToBFloat16(f), b) << std::hex << b;
    }
  }
}

TEST(BFloat16Test, FloatRoundsToNearestEven) {
  std::mt19937 random(20240602);
  std::vector<float> floats;
  for (int i = 0; i < 2'000'000; ++i) {
    floats.push_back(FloatFromBits(static_cast<uint32_t>(random())));
  }
  // Every tie and its neighbours for a spread of exponents.
  for (uint32_t high = 0; high < 0x10000; high += 7) {
    const uint32_t tie = (high << 16) | 0x8000;
    floats.push_back(FloatFromBits(tie));
    floats.push_back(FloatFromBits(tie - 1));
    floats.push_back(FloatFromBits(tie + 1));
  }
  for (float f : floats) {
    if (std::isnan(f)) {
      EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(f)));
      continue;
    }
    if (std::isinf(f)) continue;
    EXPECT_EQ(FloatToBFloat16(f), ReferenceToBFloat16(f))
        << "float bits 0x" << std::hex << FloatBits(f);
  }
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(FloatFromBits(0x7f800001))));
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
}

}  // namespace
}  // namespace gradsync
