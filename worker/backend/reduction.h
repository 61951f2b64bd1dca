// The arithmetic of the CPU backends' reductions, in one place (as Gloo keeps
// its own in gloo/math.h): which C++ type holds each DataType, sums and the
// division of an average, and the whole reduction of several ranks' inputs
// the shm backend runs.
//
// The numerics, which every backend must keep: float32, float64, int32,
// int64 and uint8 are summed in their own type, integers as their unsigned
// type so that overflow wraps around instead of being undefined; float16 and
// bfloat16 are computed on in float32 and rounded to nearest even. kAverage
// divides the sum by the world size: floats exactly as `/` rounds, integers
// truncating toward zero.
//
// The loops run over restrict pointers in blocks of a fixed number of
// elements, so that the compiler vectorizes them even under -O2's cheapest
// cost model. Every function here is pure and thread-safe; none keeps a
// pointer it was given.
#ifndef GRADSYNC_WORKER_BACKEND_REDUCTION_H_
#define GRADSYNC_WORKER_BACKEND_REDUCTION_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/logging.h"
#include "worker/backend/backend.h"
#include "worker/backend/float16.h"

namespace gradsync {
namespace reduction {

// The 16-bit floats as a Buffer holds them: raw bits.
struct Float16Bits {
  uint16_t bits;
};
struct BFloat16Bits {
  uint16_t bits;
};

// Calls `f` with a value (zero) of the C++ type that holds an element of
// `dtype`: float, double, int32_t, int64_t, uint8_t, Float16Bits or
// BFloat16Bits.
template <typename F>
void VisitDataType(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat64:
      return f(double{});
    case DataType::kFloat16:
      return f(Float16Bits{});
    case DataType::kBFloat16:
      return f(BFloat16Bits{});
    case DataType::kInt32:
      return f(int32_t{});
    case DataType::kInt64:
      return f(int64_t{});
    case DataType::kUInt8:
      return f(uint8_t{});
  }
  GS_CHECK(false) << "unknown dtype " << static_cast<int>(dtype);
}

// How a 16-bit float type converts to and from float32, in which it is
// computed on. Specialized here for Float16Bits and BFloat16Bits; a backend
// with a 16-bit type of its own (Gloo's gloo::float16) specializes it too.
template <typename T>
struct HalfFloat {
  static constexpr bool kIsHalf = false;
};
template <>
struct HalfFloat<Float16Bits> {
  static constexpr bool kIsHalf = true;
  static float ToFloat(Float16Bits h) { return Float16ToFloat(h.bits); }
  static Float16Bits FromFloat(float f) { return {FloatToFloat16(f)}; }
};
template <>
struct HalfFloat<BFloat16Bits> {
  static constexpr bool kIsHalf = true;
  static float ToFloat(BFloat16Bits b) { return BFloat16ToFloat(b.bits); }
  static BFloat16Bits FromFloat(float f) { return {FloatToBFloat16(f)}; }
};

// Elements per block of the vectorized loops.
constexpr size_t kLanes = 16;

// The type a T is summed in: integers as their unsigned type.
template <typename T, bool = std::is_integral_v<T>>
struct SumTypeOf {
  using type = T;
};
template <typename T>
struct SumTypeOf<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename T>
using SumType = typename SumTypeOf<T>::type;

// out[i] = a[i] + b[i], for i in [0, n). No two of the arrays may overlap.
template <typename U>
void Add(U* __restrict out, const U* __restrict a, const U* __restrict b,
         size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      out[i + j] = static_cast<U>(a[i + j] + b[i + j]);
    }
  }
  for (; i < n; ++i) out[i] = static_cast<U>(a[i] + b[i]);
}

// out[i] += a[i], for i in [0, n). The arrays may not overlap.
template <typename U>
void AddInPlace(U* __restrict out, const U* __restrict a, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      out[i + j] = static_cast<U>(out[i + j] + a[i + j]);
    }
  }
  for (; i < n; ++i) out[i] = static_cast<U>(out[i] + a[i]);
}

// out[i] = a[i] + b[i] for a 16-bit float type: summed in float, rounded
// once. Unlike Add, `out` may be `a` or `b` (Gloo reduces in place).
template <typename T>
void AddThroughFloat(T* out, const T* a, const T* b, size_t n) {
  using H = HalfFloat<T>;
  static_assert(H::kIsHalf, "AddThroughFloat is for the 16-bit floats");
  for (size_t i = 0; i < n; ++i) {
    out[i] = H::FromFloat(H::ToFloat(a[i]) + H::ToFloat(b[i]));
  }
}

// Divides each of the n elements by the world size (an average's last step):
// floats exactly as `/` rounds (as Gloo does), integers truncating toward
// zero, 16-bit floats divided in float and rounded once.
template <typename T>
void DivideInPlace(T* __restrict data, size_t n, int world_size) {
  if constexpr (HalfFloat<T>::kIsHalf) {
    using H = HalfFloat<T>;
    const float divisor = static_cast<float>(world_size);
    for (size_t i = 0; i < n; ++i) {
      data[i] = H::FromFloat(H::ToFloat(data[i]) / divisor);
    }
  } else {
    const T divisor = static_cast<T>(world_size);
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (size_t j = 0; j < kLanes; ++j) {
        data[i + j] = static_cast<T>(data[i + j] / divisor);
      }
    }
    for (; i < n; ++i) data[i] = static_cast<T>(data[i] / divisor);
  }
}

// Where each rank's input to a reduction lies: rank r's at `base` +
// r * `stride` bytes (the shm backend's slots), except rank `own_rank`'s,
// at `own` (its own buffer). Points into memory it does not own.
struct RankInputs {
  const char* base;
  size_t stride;
  int count;  // ranks
  int own_rank;
  const char* own;
  template <typename T>
  const T* at(int rank, size_t first) const {
    return reinterpret_cast<const T*>(rank == own_rank ? own
                                                       : base + rank * stride) +
           first;
  }
};

// out[i] = sum over ranks of in[rank][first + i] (divided by the number of
// ranks for kAverage), for i in [0, n), elements of `dtype`. Every element is
// summed in rank order, so equal inputs give identical bits on every rank.
// The 16-bit floats are summed in float and rounded once (with the F16C
// instructions for float16 where the CPU has them: the same results). `out`
// may not overlap the inputs.
void ReduceRanks(DataType dtype, const RankInputs& in, size_t first, size_t n,
                 ReduceOp op, void* out);

}  // namespace reduction
}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_REDUCTION_H_
