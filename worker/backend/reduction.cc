#include "worker/backend/reduction.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GRADSYNC_REDUCTION_F16C 1
#endif

#include <cstring>

namespace gradsync {
namespace reduction {
namespace {

// out[i] = sum over ranks of in[rank][first + i] (divided by the world size
// for kAverage), for i in [0, n).
template <typename T>
void ReduceNative(const RankInputs& in, size_t first, size_t n, ReduceOp op,
                  T* out) {
  using U = SumType<T>;
  U* sum = reinterpret_cast<U*>(out);
  if (in.count == 1) {
    std::memcpy(sum, in.at<U>(0, first), n * sizeof(U));
  } else {
    Add(sum, in.at<U>(0, first), in.at<U>(1, first), n);
    for (int r = 2; r < in.count; ++r) AddInPlace(sum, in.at<U>(r, first), n);
  }
  if (op == ReduceOp::kAverage) DivideInPlace(out, n, in.count);
}

// The 16-bit floats: summed in float, in blocks, rounded once. `kFull`
// blocks have a size known at compile time, so their loops vectorize.
constexpr size_t kBlock16 = 256;

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), bool kFull>
void ReduceBlock16(const RankInputs& in, size_t first, size_t size, ReduceOp op,
                   uint16_t* __restrict out) {
  const size_t m = kFull ? kBlock16 : size;
  float sum[kBlock16];
  const uint16_t* __restrict a = in.at<uint16_t>(0, first);
  for (size_t j = 0; j < m; ++j) sum[j] = ToFloat(a[j]);
  for (int r = 1; r < in.count; ++r) {
    const uint16_t* __restrict b = in.at<uint16_t>(r, first);
    for (size_t j = 0; j < m; ++j) sum[j] += ToFloat(b[j]);
  }
  if (op == ReduceOp::kAverage) {
    const float divisor = static_cast<float>(in.count);
    for (size_t j = 0; j < m; ++j) sum[j] /= divisor;
  }
  for (size_t j = 0; j < m; ++j) out[j] = FromFloat(sum[j]);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Reduce16(const RankInputs& in, size_t first, size_t n, ReduceOp op,
              uint16_t* out) {
  size_t i = 0;
  for (; i + kBlock16 <= n; i += kBlock16) {
    ReduceBlock16<ToFloat, FromFloat, true>(in, first + i, kBlock16, op,
                                            out + i);
  }
  if (i < n) {
    ReduceBlock16<ToFloat, FromFloat, false>(in, first + i, n - i, op, out + i);
  }
}

#ifdef GRADSYNC_REDUCTION_F16C
// float16 with the F16C instructions, 8 conversions each, where the CPU has
// them (compiled for it whatever the build's target): the same results as
// Reduce16, several times faster.
__attribute__((target("avx,f16c"))) void ReduceFloat16WithF16c(
    const RankInputs& in, size_t first, size_t n, ReduceOp op, uint16_t* out) {
  const __m256 divisor = _mm256_set1_ps(static_cast<float>(in.count));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 sum = _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(in.at<uint16_t>(0, first + i))));
    for (int r = 1; r < in.count; ++r) {
      sum = _mm256_add_ps(
          sum, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                   in.at<uint16_t>(r, first + i)))));
    }
    if (op == ReduceOp::kAverage) sum = _mm256_div_ps(sum, divisor);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    Reduce16<Float16ToFloat, FloatToFloat16>(in, first + i, n - i, op, out + i);
  }
}

bool HaveF16c() {
  static const bool have =
      __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return have;
}
#endif

}  // namespace

void ReduceRanks(DataType dtype, const RankInputs& in, size_t first, size_t n,
                 ReduceOp op, void* out) {
  VisitDataType(dtype, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, Float16Bits>) {
#ifdef GRADSYNC_REDUCTION_F16C
      if (HaveF16c()) {
        return ReduceFloat16WithF16c(in, first, n, op,
                                     static_cast<uint16_t*>(out));
      }
#endif
      return Reduce16<Float16ToFloat, FloatToFloat16>(
          in, first, n, op, static_cast<uint16_t*>(out));
    } else if constexpr (std::is_same_v<T, BFloat16Bits>) {
      return Reduce16<BFloat16ToFloat, FloatToBFloat16>(
          in, first, n, op, static_cast<uint16_t*>(out));
    } else {
      return ReduceNative(in, first, n, op, static_cast<T*>(out));
    }
  });
}

}  // namespace reduction
}  // namespace gradsync
