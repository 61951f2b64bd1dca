// Tests of the CPU backends' reduction arithmetic: ReduceRanks over inputs
// laid out as the shm backend lays them (with this rank's own input in a
// buffer of its own), DivideInPlace, AddThroughFloat and the dtype dispatch,
// at element counts around the kernels' block sizes (0, 1, odd counts, a
// full 16-bit block and more). Results are checked against closed forms.
#include "worker/backend/reduction.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/backend.h"
#include "worker/backend/float16.h"

namespace gradsync {
namespace {

using reduction::BFloat16Bits;
using reduction::Float16Bits;
using reduction::RankInputs;

// Counts that straddle the vector lanes (16), F16C's 8 and the 16-bit
// blocks (256).
const size_t kCounts[] = {0, 1, 7, 17, 256, 300};

// The ranks' inputs as the shm backend sees them: every rank's elements in
// its slot, one after another, except rank `own_rank`'s, which lie in a
// buffer of their own while its slot holds junk that must not be read. One
// more element of junk at each end keeps every pointer valid at 0 elements.
template <typename T>
class Slots {
 public:
  Slots(const std::vector<std::vector<T>>& per_rank, int own_rank)
      : n_(per_rank[0].size()),
        ranks_(static_cast<int>(per_rank.size())),
        own_rank_(own_rank),
        own_(per_rank[own_rank]) {
    own_.push_back(Junk());
    slots_.assign(ranks_ * n_ + 1, Junk());
    for (int r = 0; r < ranks_; ++r) {
      if (r == own_rank) continue;
      std::memcpy(slots_.data() + r * n_, per_rank[r].data(), n_ * sizeof(T));
    }
  }

  RankInputs inputs() const {
    return RankInputs{reinterpret_cast<const char*>(slots_.data()),
                      n_ * sizeof(T), ranks_, own_rank_,
                      reinterpret_cast<const char*>(own_.data())};
  }

 private:
  static T Junk() {
    T junk;
    std::memset(&junk, 0x5a, sizeof(junk));
    return junk;
  }

  size_t n_;
  int ranks_;
  int own_rank_;
  std::vector<T> own_;
  std::vector<T> slots_;
};

// ReduceRanks over `in` (one vector per rank, all of one size) from element
// `first` on.
template <typename T>
std::vector<T> Reduced(DataType dtype, const std::vector<std::vector<T>>& in,
                       int own_rank, ReduceOp op, size_t first = 0) {
  const size_t n = in[0].size() - first;
  std::vector<T> out(n + 1);
  const Slots<T> slots(in, own_rank);
  reduction::ReduceRanks(dtype, slots.inputs(), first, n, op, out.data());
  out.resize(n);
  return out;
}

std::vector<std::vector<uint16_t>> Filled(int ranks, size_t n,
                                          const std::vector<uint16_t>& each) {
  std::vector<std::vector<uint16_t>> in(ranks);
  for (int r = 0; r < ranks; ++r) in[r].assign(n, each[r]);
  return in;
}

template <typename T>
class NativeReductionTest : public ::testing::Test {};
using NativeTypes = ::testing::Types<float, double, int32_t, int64_t, uint8_t>;
TYPED_TEST_SUITE(NativeReductionTest, NativeTypes);

template <typename T>
DataType DtypeOf() {
  if constexpr (std::is_same_v<T, float>) return DataType::kFloat32;
  if constexpr (std::is_same_v<T, double>) return DataType::kFloat64;
  if constexpr (std::is_same_v<T, int32_t>) return DataType::kInt32;
  if constexpr (std::is_same_v<T, int64_t>) return DataType::kInt64;
  return DataType::kUInt8;
}

TYPED_TEST(NativeReductionTest, SumsEveryRanksInputAtEveryCount) {
  using T = TypeParam;
  for (const int ranks : {1, 2, 3, 5}) {
    for (const size_t n : kCounts) {
      std::vector<std::vector<T>> in(ranks, std::vector<T>(n));
      for (int r = 0; r < ranks; ++r) {
        for (size_t i = 0; i < n; ++i) in[r][i] = static_cast<T>(r + i % 9);
      }
      const std::vector<T> sum =
          Reduced(DtypeOf<T>(), in, ranks / 2, ReduceOp::kSum);
      ASSERT_EQ(sum.size(), n);
      for (size_t i = 0; i < n; ++i) {
        // sum over r of (r + i % 9), exact in every type here.
        const T expected = static_cast<T>(ranks * (ranks - 1) / 2 +
                                          ranks * static_cast<int>(i % 9));
        ASSERT_EQ(sum[i], expected)
            << ranks << " ranks, " << n << " elements, element " << i;
      }
    }
  }
}

TYPED_TEST(NativeReductionTest, AveragesAsTheSumDividedByTheRanks) {
  using T = TypeParam;
  std::vector<std::vector<T>> in(3, std::vector<T>(17));
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < 17; ++i) in[r][i] = static_cast<T>(r * 2 + i);
  }
  const std::vector<T> average =
      Reduced(DtypeOf<T>(), in, 0, ReduceOp::kAverage);
  for (size_t i = 0; i < 17; ++i) {
    const T sum = static_cast<T>(6 + 3 * i);
    EXPECT_EQ(average[i], static_cast<T>(sum / static_cast<T>(3))) << i;
  }
}

TEST(ReduceRanksTest, ReducesFromAnOffsetIntoTheChunk) {
  std::vector<std::vector<int32_t>> in = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  EXPECT_EQ(Reduced(DataType::kInt32, in, 1, ReduceOp::kSum, 1),
            (std::vector<int32_t>{22, 33, 44}));
}

TEST(ReduceRanksTest, FloatAverageRoundsAsDivisionDoes) {
  std::vector<std::vector<float>> in = {{1.0f}, {0.0f}, {0.0f}};
  const volatile float three = 3.0f;  // divided at run time, like the kernel
  EXPECT_EQ(Reduced(DataType::kFloat32, in, 0, ReduceOp::kAverage)[0],
            1.0f / three);
}

TEST(ReduceRanksTest, IntegerAverageTruncatesTowardZero) {
  std::vector<std::vector<int32_t>> in = {{-4, 4, -1}, {-3, 3, 0}};
  EXPECT_EQ(Reduced(DataType::kInt32, in, 0, ReduceOp::kAverage),
            (std::vector<int32_t>{-3, 3, 0}));
  std::vector<std::vector<int64_t>> wide = {{-5}, {0}, {0}};
  EXPECT_EQ(Reduced(DataType::kInt64, wide, 2, ReduceOp::kAverage),
            (std::vector<int64_t>{-1}));
}

TEST(ReduceRanksTest, IntegerSumsWrapAround) {
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int32_t>> narrow(2, std::vector<int32_t>(17, 1));
  narrow[0].assign(17, kMax32);
  for (int32_t sum : Reduced(DataType::kInt32, narrow, 0, ReduceOp::kSum)) {
    EXPECT_EQ(sum, std::numeric_limits<int32_t>::min());
  }
  std::vector<std::vector<int64_t>> wide = {{kMax64}, {kMax64}};
  EXPECT_EQ(Reduced(DataType::kInt64, wide, 1, ReduceOp::kSum),
            (std::vector<int64_t>{-2}));
  std::vector<std::vector<uint8_t>> bytes = {{200, 255}, {100, 1}};
  EXPECT_EQ(Reduced(DataType::kUInt8, bytes, 0, ReduceOp::kSum),
            (std::vector<uint8_t>{44, 0}));
}

// A 16-bit float format and a value `big` whose neighbours are 2 apart:
// big + 1 is a tie (rounded to even: big) and big + 2 is exact.
struct SixteenBitFormat {
  const char* name;
  DataType dtype;
  uint16_t (*from_float)(float);
  float (*to_float)(uint16_t);
  float big;
};

void PrintTo(const SixteenBitFormat& format, std::ostream* os) {
  *os << format.name;
}

class SixteenBitReductionTest
    : public ::testing::TestWithParam<SixteenBitFormat> {};

// big + 1 + 1: rounded after each addition it stays big; summed in float
// and rounded once it is big + 2. The counts run through F16C's 8-wide
// steps, a full 256-element block and a tail.
TEST_P(SixteenBitReductionTest, SumsInFloatAndRoundsOnce) {
  const SixteenBitFormat& format = GetParam();
  const uint16_t one = format.from_float(1.0f);
  for (const size_t n : kCounts) {
    const auto in = Filled(3, n, {format.from_float(format.big), one, one});
    for (const uint16_t sum : Reduced(format.dtype, in, 1, ReduceOp::kSum)) {
      ASSERT_EQ(format.to_float(sum), format.big + 2.0f) << n << " elements";
    }
  }
}

TEST_P(SixteenBitReductionTest, AverageDividesBeforeRounding) {
  const SixteenBitFormat& format = GetParam();
  const uint16_t one = format.from_float(1.0f);
  const volatile float two = 2.0f;  // divided at run time, like the kernel
  for (const size_t n : kCounts) {
    const auto in = Filled(3, n, {one, one, format.from_float(0.0f)});
    for (const uint16_t average :
         Reduced(format.dtype, in, 0, ReduceOp::kAverage)) {
      ASSERT_EQ(average, format.from_float(two / 3.0f)) << n << " elements";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, SixteenBitReductionTest,
    ::testing::Values(SixteenBitFormat{"float16", DataType::kFloat16,
                                       FloatToFloat16, Float16ToFloat, 2048.0f},
                      SixteenBitFormat{"bfloat16", DataType::kBFloat16,
                                       FloatToBFloat16, BFloat16ToFloat,
                                       256.0f}),
    [](const ::testing::TestParamInfo<SixteenBitFormat>& info) {
      return std::string(info.param.name);
    });

TEST(DivideInPlaceTest, FloatsRoundAsDivisionIntegersTruncateTowardZero) {
  std::vector<float> floats(17, 1.0f);
  reduction::DivideInPlace(floats.data(), floats.size(), 3);
  const volatile float three = 3.0f;
  for (float f : floats) EXPECT_EQ(f, 1.0f / three);

  std::vector<int32_t> ints = {-7, 7, -1, 1, 0};
  reduction::DivideInPlace(ints.data(), ints.size(), 2);
  EXPECT_EQ(ints, (std::vector<int32_t>{-3, 3, 0, 0, 0}));

  std::vector<uint8_t> bytes = {255, 3};
  reduction::DivideInPlace(bytes.data(), bytes.size(), 2);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{127, 1}));
}

TEST(DivideInPlaceTest, SixteenBitFloatsDivideInFloatAndRoundOnce) {
  std::vector<Float16Bits> halves(17, Float16Bits{FloatToFloat16(2.0f)});
  reduction::DivideInPlace(halves.data(), halves.size(), 3);
  for (Float16Bits h : halves) {
    EXPECT_EQ(h.bits, FloatToFloat16(2.0f / 3.0f));
  }
  std::vector<BFloat16Bits> bfloat_halves(3,
                                          BFloat16Bits{FloatToBFloat16(2.0f)});
  reduction::DivideInPlace(bfloat_halves.data(), bfloat_halves.size(), 3);
  for (BFloat16Bits b : bfloat_halves) {
    EXPECT_EQ(b.bits, FloatToBFloat16(2.0f / 3.0f));
  }
}

TEST(DivideInPlaceTest, NoElementsIsANoOp) {
  int32_t untouched = 9;
  reduction::DivideInPlace(&untouched, 0, 2);
  EXPECT_EQ(untouched, 9);
}

TEST(AddThroughFloatTest, RoundsEachSumOnceAndMayRunInPlace) {
  // 256 + 1 is a tie in bfloat16: to even, 256.
  std::vector<BFloat16Bits> a = {{FloatToBFloat16(256.0f)},
                                 {FloatToBFloat16(1.5f)}};
  const std::vector<BFloat16Bits> b = {{FloatToBFloat16(1.0f)},
                                       {FloatToBFloat16(2.25f)}};
  reduction::AddThroughFloat(a.data(), a.data(), b.data(), a.size());
  EXPECT_EQ(BFloat16ToFloat(a[0].bits), 256.0f);
  EXPECT_EQ(BFloat16ToFloat(a[1].bits), 3.75f);
}

TEST(VisitDataTypeTest, VisitsTheTypeThatHoldsEachDtype) {
  for (const DataType dtype :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
        DataType::kBFloat16, DataType::kInt32, DataType::kInt64,
        DataType::kUInt8}) {
    size_t size = 0;
    bool is_half = false;
    reduction::VisitDataType(dtype, [&](auto zero) {
      using T = decltype(zero);
      size = sizeof(T);
      is_half = reduction::HalfFloat<T>::kIsHalf;
    });
    EXPECT_EQ(size, DataTypeSize(dtype)) << DataTypeName(dtype);
    EXPECT_EQ(is_half,
              dtype == DataType::kFloat16 || dtype == DataType::kBFloat16)
        << DataTypeName(dtype);
  }
}

}  // namespace
}  // namespace gradsync
