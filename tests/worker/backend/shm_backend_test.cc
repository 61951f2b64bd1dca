// Tests of ShmBackend: N ranks as N threads of this process bootstrapping
// concurrently through one InMemoryStore, and as forked processes through a
// store in files. Small slots force collectives into many chunks. Results
// are checked element for element against closed forms. What every backend
// does alike is in backend_conformance_test; here, what is the shared-memory
// backend's own: its dtypes, slots, segment, bootstrap and processes.
#include "worker/backend/shm_backend.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/eventually.h"
#include "tests/worker/backend/backend_test_util.h"
#include "worker/backend/backend.h"
#include "worker/backend/file_store.h"
#include "worker/backend/float16.h"
#include "worker/backend/store.h"
#include "worker/backend/work.h"

namespace gradsync {
namespace {

using ::gradsync::testing::BufferOf;
using ::gradsync::testing::DtypeOf;
using ::gradsync::testing::ElementPrinter;
using ::gradsync::testing::ExpectAllOk;
using ::gradsync::testing::ExpectElements;
using ::gradsync::testing::kBound;
using ::gradsync::testing::kBriefly;
using ::gradsync::testing::kHealthyTimeout;
using ::gradsync::testing::OnEveryRank;
using ::gradsync::testing::OptionsFor;
using ::testing::AnyOf;
using ::testing::Combine;
using ::testing::HasSubstr;
using ::testing::Values;

// Slots this small split every collective of more than a few hundred
// elements into many chunks.
constexpr size_t kSmallSlot = 4096;
// Element counts: empty, one, odd sizes that do not divide among the ranks,
// one just past a slot of float32, and one of many slots.
constexpr size_t kCounts[] = {0, 1, 7, 1000, 1025, (1 << 16) + 3};

// 16-bit float storage types, compared by bits.
struct Half {
  uint16_t bits = 0;
  bool operator==(const Half& other) const { return bits == other.bits; }
};
struct BHalf {
  uint16_t bits = 0;
  bool operator==(const BHalf& other) const { return bits == other.bits; }
};

// From(x): the element nearest to x, for the floating types.
template <typename T>
T From(double x) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{FloatToFloat16(static_cast<float>(x))};
  } else if constexpr (std::is_same_v<T, BHalf>) {
    return BHalf{FloatToBFloat16(static_cast<float>(x))};
  } else {
    return static_cast<T>(x);
  }
}

ShmOptions SlotOf(size_t bytes) {
  ShmOptions options;
  options.slot_bytes = bytes;
  return options;
}

// Creates the backends of `world_size` ranks, bootstrapping concurrently
// through `store`. Empty (and the test failed) if any rank could not.
std::vector<std::unique_ptr<ShmBackend>> StartGroup(
    int world_size, Store* store, absl::Duration timeout = kHealthyTimeout,
    ShmOptions shm = SlotOf(kSmallSlot)) {
  return testing::StartGroup<ShmBackend>(world_size, [&](int rank) {
    return ShmBackend::Create(OptionsFor(rank, world_size, timeout), store,
                              shm);
  });
}

// The segments this process created that are still in /dev/shm.
std::vector<std::string> LeftoverSegments() {
  const std::string prefix = absl::StrCat("gradsync-shm-", getpid(), "-");
  std::vector<std::string> found;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      if (absl::StartsWith(entry->d_name, prefix)) {
        found.push_back(entry->d_name);
      }
    }
    closedir(dir);
  }
  return found;
}

bool SegmentExists(const std::string& name) {
  return access(absl::StrCat("/dev/shm", name).c_str(), F_OK) == 0;
}

}  // namespace

namespace testing {
template <>
struct DtypeOf<Half> {
  static constexpr DataType kType = DataType::kFloat16;
};
template <>
struct DtypeOf<BHalf> {
  static constexpr DataType kType = DataType::kBFloat16;
};
template <>
struct ElementPrinter<Half> {
  static float Print(Half x) { return Float16ToFloat(x.bits); }
};
template <>
struct ElementPrinter<BHalf> {
  static float Print(BHalf x) { return BFloat16ToFloat(x.bits); }
};
}  // namespace testing

namespace {

// ---------------------------------------------------------------------------
// The dtypes beyond float32 and int64, over world size x element count (the
// collectives every backend has, the barrier, abort, ordering and argument
// errors: backend_conformance_test).

class ShmCollectiveTest
    : public ::testing::TestWithParam<std::tuple<int, size_t>> {
 protected:
  void SetUp() override {
    backends_ = StartGroup(world_size(), &store_);
    ASSERT_EQ(static_cast<int>(backends_.size()), world_size());
  }

  int world_size() const { return std::get<0>(GetParam()); }
  size_t count() const { return std::get<1>(GetParam()); }

  // Rank r's input: value(r, i) for i in [0, count()).
  template <typename T, typename Value>
  std::vector<std::vector<T>> Inputs(Value value) const {
    std::vector<std::vector<T>> inputs(world_size());
    for (int r = 0; r < world_size(); ++r) {
      inputs[r].resize(count());
      for (size_t i = 0; i < count(); ++i) inputs[r][i] = value(r, i);
    }
    return inputs;
  }

  // All-reduces value(r, i) on every rank r with `op` and checks that every
  // rank ends with expected(i).
  template <typename T, typename Value, typename Expected>
  void CheckAllReduce(ReduceOp op, Value value, Expected expected) {
    auto buffers = Inputs<T>(value);
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < world_size(); ++r) {
      works.push_back(backends_[r]->AllReduce(BufferOf(buffers[r]), op));
    }
    ExpectAllOk(works);
    for (int r = 0; r < world_size(); ++r) {
      ExpectElements(
          buffers[r], expected,
          absl::StrCat(DataTypeName(DtypeOf<T>::kType), " ",
                       op == ReduceOp::kSum ? "sum" : "average", ", rank ", r));
    }
  }

  // Floating types: value(r, i) and the exact sum and average, computed in
  // double (the test values are exact in T).
  template <typename T, typename Value>
  void CheckFloating(Value value) {
    const int n = world_size();
    auto sum = [&](size_t i) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += value(r, i);
      return s;
    };
    CheckAllReduce<T>(
        ReduceOp::kSum, [&](int r, size_t i) { return From<T>(value(r, i)); },
        [&](size_t i) { return From<T>(sum(i)); });
    CheckAllReduce<T>(
        ReduceOp::kAverage,
        [&](int r, size_t i) { return From<T>(value(r, i)); },
        [&](size_t i) { return From<T>(sum(i) / n); });
  }

  // Integer types: sums wrap around in T; averages truncate toward zero.
  template <typename T, typename Value>
  void CheckIntegral(Value value) {
    const int n = world_size();
    auto sum = [&](size_t i) {
      std::make_unsigned_t<T> s = 0;
      for (int r = 0; r < n; ++r)
        s += static_cast<std::make_unsigned_t<T>>(value(r, i));
      return static_cast<T>(s);
    };
    CheckAllReduce<T>(ReduceOp::kSum, value, sum);
    CheckAllReduce<T>(ReduceOp::kAverage, value, [&](size_t i) {
      return static_cast<T>(sum(i) / static_cast<T>(n));
    });
  }

  InMemoryStore store_;
  std::vector<std::unique_ptr<ShmBackend>> backends_;
};

TEST_P(ShmCollectiveTest, AllReduceOfFloat64) {
  CheckFloating<double>([](int r, size_t i) { return r * 1e9 + i + 0.25; });
}

// Values up to 1018 in sums and halves in averages: exact in float16.
TEST_P(ShmCollectiveTest, AllReduceOfFloat16) {
  CheckFloating<Half>([](int r, size_t i) { return (i % 251) + 3.0 * r; });
}

// Values up to 126 in sums and quarters in averages: exact in bfloat16.
TEST_P(ShmCollectiveTest, AllReduceOfBFloat16) {
  CheckFloating<BHalf>([](int r, size_t i) { return (i % 31) + 1.0 * r; });
}

// Negative values too, so that averages truncate toward zero.
TEST_P(ShmCollectiveTest, AllReduceOfInt32) {
  CheckIntegral<int32_t>([](int r, size_t i) {
    return static_cast<int32_t>((r - 2) * 1'000'003 + static_cast<int>(i));
  });
}

// Sums past 255 wrap around.
TEST_P(ShmCollectiveTest, AllReduceOfUInt8Wraps) {
  CheckIntegral<uint8_t>([](int r, size_t i) {
    return static_cast<uint8_t>((i * 37 + r * 101 + 200) % 256);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizeByCount, ShmCollectiveTest,
                         Combine(Values(1, 2, 3, 4),
                                 ::testing::ValuesIn(kCounts)),
                         testing::WorldAndCountName);

// ---------------------------------------------------------------------------
// Behaviour that depends on the world size only.

class ShmGroupTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    backends_ = StartGroup(world_size(), &store_);
    ASSERT_EQ(static_cast<int>(backends_.size()), world_size());
  }

  int world_size() const { return GetParam(); }

  InMemoryStore store_;
  std::vector<std::unique_ptr<ShmBackend>> backends_;
};

// float16 and bfloat16 are summed in float and rounded once: 1024 + 0.5 +
// ... + 0.5 keeps every half (a float16 sum rounded at each step would stay
// at 1024, whose spacing is 1).
TEST_P(ShmGroupTest, SixteenBitFloatsAreRoundedOnce) {
  const int n = world_size();
  std::vector<std::vector<Half>> halves(n);
  std::vector<std::vector<BHalf>> bhalves(n);
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < n; ++r) {
    // 11 elements: a vector of 8 and a scalar tail, where those differ.
    halves[r].assign(11, From<Half>(r == 0 ? 1024 : 0.5));
    bhalves[r].assign(11, From<BHalf>(r == 0 ? 256 : 0.5));
    works.push_back(
        backends_[r]->AllReduce(BufferOf(halves[r]), ReduceOp::kSum));
    works.push_back(
        backends_[r]->AllReduce(BufferOf(bhalves[r]), ReduceOp::kSum));
  }
  ExpectAllOk(works);
  // Nearest even: float16 1024 + k/2 has spacing 1; bfloat16 256 + k/2 has
  // spacing 2.
  const double half_sum = 1024 + 0.5 * (n - 1);
  const double bhalf_sum = 256 + 0.5 * (n - 1);
  for (int r = 0; r < n; ++r) {
    ExpectElements(
        halves[r], [&](size_t) { return From<Half>(half_sum); },
        absl::StrCat("float16, rank ", r));
    ExpectElements(
        bhalves[r], [&](size_t) { return From<BHalf>(bhalf_sum); },
        absl::StrCat("bfloat16, rank ", r));
  }
  // Where rounding at each step would lose the halves.
  if (n == 3) {
    EXPECT_EQ(ElementPrinter<Half>::Print(halves[0][0]), 1025.0);
  }
  if (n == 4) {
    EXPECT_EQ(ElementPrinter<Half>::Print(halves[0][0]),
              1026.0);  // 1025.5: even
    EXPECT_EQ(ElementPrinter<BHalf>::Print(bhalves[0][0]), 258.0);  // 257.5
  }
}

// Sums and averages of arbitrary 16-bit floats (most of them inexact) equal
// the sum in float, in rank order, rounded once: on every path (vector
// instructions for whole vectors, scalar code for the rest).
TEST_P(ShmGroupTest, SixteenBitFloatsMatchTheFloatSumRoundedOnce) {
  const int n = world_size();
  constexpr size_t kCount = 1001;
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-100.0f, 100.0f);
  auto check = [&](auto zero, float (*to_float)(uint16_t),
                   uint16_t (*from_float)(float), ReduceOp op) {
    using T = decltype(zero);
    std::vector<std::vector<T>> inputs(n);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < kCount; ++i) {
        inputs[r].push_back(T{from_float(uniform(random))});
      }
    }
    auto buffers = inputs;
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < n; ++r) {
      works.push_back(backends_[r]->AllReduce(BufferOf(buffers[r]), op));
    }
    ExpectAllOk(works);
    auto expected = [&](size_t i) {
      float sum = to_float(inputs[0][i].bits);
      for (int r = 1; r < n; ++r) sum += to_float(inputs[r][i].bits);
      if (op == ReduceOp::kAverage) sum /= static_cast<float>(n);
      return T{from_float(sum)};
    };
    for (int r = 0; r < n; ++r) {
      ExpectElements(
          buffers[r], expected,
          absl::StrCat(DataTypeName(DtypeOf<T>::kType), " ",
                       op == ReduceOp::kSum ? "sum" : "average", ", rank ", r));
    }
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    check(Half{}, Float16ToFloat, FloatToFloat16, op);
    check(BHalf{}, BFloat16ToFloat, FloatToBFloat16, op);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmGroupTest, Values(1, 2, 3, 4),
                         testing::WorldName);

// The default 4 MiB slots, with a buffer of several slots: the size a DDP
// bucket has.
TEST(ShmBackendTest, LargeAllReduceWithDefaultSlots) {
  constexpr int kWorld = 2;
  constexpr size_t kCount = 3'000'001;  // 12 MB of float32: three slots
  InMemoryStore store;
  auto backends = StartGroup(kWorld, &store, kHealthyTimeout, ShmOptions());
  ASSERT_EQ(backends.size(), 2u);
  std::vector<std::vector<float>> data(kWorld);
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < kCount; ++i) data[r].push_back((i % 4096) + r);
    works.push_back(
        backends[r]->AllReduce(BufferOf(data[r]), ReduceOp::kAverage));
  }
  ExpectAllOk(works);
  for (int r = 0; r < kWorld; ++r) {
    ExpectElements(
        data[r], [](size_t i) { return (i % 4096) + 0.5; },
        absl::StrCat("rank ", r));
  }
}

TEST(ShmBackendTest, SegmentNameIsRemovedOnceEveryRankAttached) {
  InMemoryStore store;
  auto backends = StartGroup(3, &store);
  ASSERT_EQ(backends.size(), 3u);
  const std::string name = backends[0]->segment_name();
  EXPECT_THAT(name, ::testing::StartsWith("/gradsync-shm-"));
  for (const auto& backend : backends) {
    EXPECT_EQ(backend->segment_name(), name);
  }
  EXPECT_FALSE(SegmentExists(name));
  EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
  // Still usable: the ranks hold the segment mapped.
  std::vector<std::vector<int32_t>> data(3, std::vector<int32_t>(10, 2));
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < 3; ++r) {
    works.push_back(backends[r]->AllReduce(BufferOf(data[r]), ReduceOp::kSum));
  }
  ExpectAllOk(works);
  ExpectElements(
      data[2], [](size_t) { return 6; }, "rank 2");
}

// ---------------------------------------------------------------------------
// Bad arguments (the options every backend checks: backend_conformance_test).

TEST(ShmBackendArgumentsTest, CreateRejectsBadOptions) {
  InMemoryStore store;
  struct Case {
    const char* what;
    BackendOptions options;
    Store* store;
    ShmOptions shm;
    const char* message;
  };
  const Case cases[] = {
      {"no store", OptionsFor(0, 1, kBound), nullptr, {}, "no store"},
      {"empty slots", OptionsFor(0, 1, kBound), &store, SlotOf(0),
       "slot_bytes 0 is not in [1, 1073741824]"},
      {"huge slots", OptionsFor(0, 1, kBound), &store, SlotOf(size_t{1} << 31),
       "slot_bytes 2147483648 is not in"},
  };
  for (const Case& c : cases) {
    auto backend = ShmBackend::Create(c.options, c.store, c.shm);
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what << ": " << backend.status();
    EXPECT_THAT(std::string(backend.status().message()), HasSubstr(c.message))
        << c.what;
  }
  EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
}

// A rank given other options than rank 0 fails naming both; rank 0 stops
// waiting for it at once.
TEST(ShmBackendArgumentsTest, RanksThatDisagreeOnTheSlotSizeFailBootstrap) {
  InMemoryStore store;
  absl::StatusOr<std::unique_ptr<ShmBackend>> created[2] = {
      absl::UnknownError("not run"), absl::UnknownError("not run")};
  const absl::Time start = absl::Now();
  OnEveryRank(2, [&](int rank) {
    created[rank] = ShmBackend::Create(OptionsFor(rank, 2, kHealthyTimeout),
                                       &store, SlotOf(4096 * (rank + 1)));
  });
  EXPECT_LT(absl::Now() - start, kBound);
  EXPECT_EQ(created[1].status().code(), absl::StatusCode::kInvalidArgument)
      << created[1].status();
  EXPECT_THAT(std::string(created[1].status().message()),
              HasSubstr("shm bootstrap (rank 1 of 2): rank 0 made the segment "
                        "for 2 ranks with 4096-byte slots; this rank has 2 "
                        "ranks with 8192-byte slots"));
  EXPECT_EQ(created[0].status().code(), absl::StatusCode::kUnavailable)
      << created[0].status();
  EXPECT_THAT(std::string(created[0].status().message()),
              HasSubstr("rank 1 left the group: its bootstrap failed"));
  EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
}

// Collectives that differ across ranks fail on every rank, naming both,
// instead of mixing the wrong data.
TEST(ShmBackendArgumentsTest, RanksThatIssueDifferentCollectivesFail) {
  InMemoryStore store;
  auto backends = StartGroup(2, &store);
  ASSERT_EQ(backends.size(), 2u);
  std::vector<float> data0(10, 1.0f);
  std::vector<float> data1(10, 1.0f);
  auto allreduce = backends[0]->AllReduce(BufferOf(data0), ReduceOp::kSum);
  auto broadcast = backends[1]->Broadcast(BufferOf(data1), 0);
  for (const auto& work : {allreduce, broadcast}) {
    absl::Status status = work->Wait(kBound);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("the ranks issued different collectives"));
  }
  EXPECT_THAT(std::string(allreduce->status().message()),
              HasSubstr("shm allreduce #1 (rank 0 of 2): the ranks issued "
                        "different collectives: this rank allreduce #1 (sum "
                        "of 10 float32), rank 1 broadcast #1 (40 bytes from "
                        "rank 0)"));
  absl::Status after = backends[0]->Barrier()->Wait(kBound);
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
}

// One rank skips a collective of no elements that the other issues: their
// sequence numbers no longer match, which the next collective reports.
TEST(ShmBackendArgumentsTest, ACollectiveSkippedByOneRankIsReported) {
  InMemoryStore store;
  auto backends = StartGroup(2, &store);
  ASSERT_EQ(backends.size(), 2u);
  std::vector<float> empty;
  std::vector<float> data0(10, 1.0f);
  std::vector<float> data1(10, 1.0f);
  backends[0]->AllReduce(BufferOf(empty), ReduceOp::kSum);
  auto work0 = backends[0]->AllReduce(BufferOf(data0), ReduceOp::kSum);
  auto work1 = backends[1]->AllReduce(BufferOf(data1), ReduceOp::kSum);
  absl::Status status = work0->Wait(kBound);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("this rank allreduce #2 (sum of 10 float32), rank 1 "
                        "allreduce #1 (sum of 10 float32)"));
  EXPECT_EQ(work1->Wait(kBound).code(), absl::StatusCode::kInternal);
}

// ---------------------------------------------------------------------------
// Failures: a missing peer, a peer that never issues a collective, a peer
// whose backend is destroyed, a backend destroyed with collectives queued.

TEST(ShmBackendFailureTest, BootstrapFailsWhenAPeerNeverArrives) {
  InMemoryStore store;
  const absl::Time start = absl::Now();
  auto backend =
      ShmBackend::Create(OptionsFor(0, 2, absl::Milliseconds(300)), &store);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kDeadlineExceeded)
      << backend.status();
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr("shm bootstrap (rank 0 of 2): 1 of 2 ranks attached "
                        "within 300ms; missing: rank 1"));
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, kBound);
  // Rank 0 removed the segment it made.
  EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
}

TEST(ShmBackendFailureTest, BootstrapFailsWhenRankZeroNeverPublishes) {
  InMemoryStore store;
  auto backend =
      ShmBackend::Create(OptionsFor(1, 2, absl::Milliseconds(300)), &store);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kDeadlineExceeded)
      << backend.status();
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr("shm bootstrap (rank 1 of 2): store get 'shm_name' "
                        "failed"));
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr("missing: shm_name"));
}

TEST(ShmBackendFailureTest, BootstrapNamesEveryRankThatDidNotAttach) {
  InMemoryStore store;
  std::vector<absl::Status> results(2);
  OnEveryRank(2, [&](int rank) {
    results[rank] =
        ShmBackend::Create(OptionsFor(rank, 4, absl::Milliseconds(300)), &store)
            .status();
  });
  // Each gives up at its own deadline, naming the ranks that never came;
  // the first to give up (either, as the threads are scheduled) may make
  // the other stop at once because it left.
  int timed_out = 0;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const absl::Status& result = results[rank];
    if (result.code() == absl::StatusCode::kDeadlineExceeded) {
      ++timed_out;
      EXPECT_THAT(std::string(result.message()),
                  HasSubstr("2 of 4 ranks attached within 300ms; missing: "
                            "rank 2, 3"));
    } else {
      EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
      EXPECT_THAT(std::string(result.message()),
                  HasSubstr(absl::StrCat("rank ", 1 - rank, " (pid ")));
      EXPECT_THAT(std::string(result.message()), HasSubstr("left the group"));
    }
  }
  EXPECT_GE(timed_out, 1);
  EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
}

TEST(ShmBackendFailureTest, CollectiveAPeerNeverIssuesFailsAtTheTimeout) {
  constexpr absl::Duration kTimeout = absl::Milliseconds(500);
  InMemoryStore store;
  auto backends = StartGroup(2, &store, kTimeout);
  ASSERT_EQ(backends.size(), 2u);
  std::vector<float> data(1000, 1.0f);

  // Rank 1 never issues this allreduce.
  const absl::Time start = absl::Now();
  auto work = backends[0]->AllReduce(BufferOf(data), ReduceOp::kSum);
  // Waiting less than the backend's timeout: the Work's own deadline.
  absl::Status early = work->Wait(kBriefly);
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
  EXPECT_THAT(std::string(early.message()), HasSubstr("did not finish within"));

  // The backend's timeout fails the collective itself, naming the rank.
  absl::Status status = work->Wait(kBound);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("shm allreduce #1 (rank 0 of 2): timed out: rank 1 "));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("last started collective #0) did not take part within "
                        "500ms"));
  EXPECT_GE(took, kTimeout - absl::Milliseconds(50));
  EXPECT_LT(took, kBound);

  // Later collectives fail at once on this rank; the peer's fails at once
  // too, naming this rank.
  absl::Status after = backends[0]->Barrier()->Wait(kBound);
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
  EXPECT_THAT(std::string(after.message()),
              HasSubstr("shm barrier #2 (rank 0 of 2): not run"));
  EXPECT_THAT(std::string(after.message()), HasSubstr("create a new backend"));

  const absl::Time peer_start = absl::Now();
  auto peer = backends[1]->AllReduce(BufferOf(data), ReduceOp::kSum);
  absl::Status peer_status = peer->Wait(kBound);
  EXPECT_EQ(peer_status.code(), absl::StatusCode::kUnavailable) << peer_status;
  EXPECT_THAT(std::string(peer_status.message()),
              HasSubstr("shm allreduce #1 (rank 1 of 2): rank 0 (pid "));
  EXPECT_THAT(std::string(peer_status.message()),
              HasSubstr("left the group: a collective failed on it"));
  EXPECT_LT(absl::Now() - peer_start, kTimeout);
}

class ShmPeerLeavesTest : public ::testing::TestWithParam<int> {};

// Rank 1's backend is destroyed while the other ranks are in an allreduce
// (multi-chunk): they fail with UNAVAILABLE well before their timeout, and
// their later collectives with ABORTED.
TEST_P(ShmPeerLeavesTest, OthersFailPromptlyWhenARankLeaves) {
  const int n = GetParam();
  InMemoryStore store;
  auto backends = StartGroup(n, &store);  // kHealthyTimeout: 20s
  ASSERT_EQ(static_cast<int>(backends.size()), n);
  std::vector<std::vector<float>> data(n, std::vector<float>(1 << 16, 1.0f));
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    works.push_back(backends[r]->AllReduce(BufferOf(data[r]), ReduceOp::kSum));
  }
  const absl::Time start = absl::Now();
  backends[1].reset();
  for (const auto& work : works) {
    absl::Status status = work->Wait(kBound);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("shm allreduce #1 (rank "));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("rank 1 (pid " + std::to_string(getpid()) +
                          ") left the group: its backend was destroyed"));
  }
  EXPECT_LT(absl::Now() - start, kBound);
  absl::Status after = backends[0]->Barrier()->Wait(kBound);
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmPeerLeavesTest, Values(2, 3, 4),
                         testing::WorldName);

// Destroying a backend stops the collective in flight at once (no waiting
// for the timeout) and cancels the queued ones.
TEST(ShmBackendFailureTest, DestroyingCancelsCollectivesPromptly) {
  InMemoryStore store;
  auto backends = StartGroup(2, &store);  // kHealthyTimeout: 20s
  ASSERT_EQ(backends.size(), 2u);
  std::vector<float> data(10, 1.0f);
  // Rank 1 issues none of these: the first blocks, and the destructor runs
  // long before its timeout.
  auto first = backends[0]->AllReduce(BufferOf(data), ReduceOp::kSum);
  auto second = backends[0]->Broadcast(BufferOf(data), 0);
  auto third = backends[0]->Barrier();
  const absl::Time start = absl::Now();
  backends[0].reset();
  EXPECT_LT(absl::Now() - start, kBound);

  // The first was either running (and stopped) or not started yet.
  EXPECT_EQ(first->status().code(), absl::StatusCode::kCancelled)
      << first->status();
  EXPECT_THAT(std::string(first->status().message()),
              AnyOf(HasSubstr("the backend was aborted or destroyed while it ran"),
                    HasSubstr("the backend was destroyed before it ran")));
  for (const auto& work : {second, third}) {
    EXPECT_EQ(work->status().code(), absl::StatusCode::kCancelled)
        << work->status();
    EXPECT_THAT(std::string(work->status().message()),
                HasSubstr("the backend was destroyed before it ran"));
  }
  EXPECT_THAT(std::string(third->status().message()),
              HasSubstr("shm barrier #3 (rank 0 of 2)"));
}

// ---------------------------------------------------------------------------
// Ranks as processes.

// A fresh directory for a FileStore.
std::string MakeStoreDir() {
  absl::StatusOr<std::string> dir = FileStore::MakeDirectory("shm_store");
  return dir.ok() ? *dir : std::string();
}

// What one process-rank does: a fixed list of collectives, each checked;
// returns 0 when every one is right, else the number of the first wrong one.
// Small slots: many chunks, so many futex waits across processes.
int RunProcessRank(int rank, int world_size, Store* store) {
  auto backend = ShmBackend::Create(
      OptionsFor(rank, world_size, kHealthyTimeout), store, SlotOf(kSmallSlot));
  if (!backend.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 backend.status().ToString().c_str());
    return 100;
  }
  return testing::CheckCollectivesOfAProcessRank(**backend);
}

// Three processes (this one as rank 0) run collectives through one segment:
// the barrier's futex is shared between processes.
TEST(ShmBackendProcessTest, RanksInSeparateProcessesAgree) {
  constexpr int kWorld = 3;
  const std::string dir = MakeStoreDir();
  ASSERT_FALSE(dir.empty());
  FileStore store(dir);
  std::vector<pid_t> children;
  for (int rank = 1; rank < kWorld; ++rank) {
    children.push_back(
        testing::ForkRank([&, rank] { return RunProcessRank(rank, kWorld, &store); }));
    ASSERT_GT(children.back(), 0);
  }
  EXPECT_EQ(RunProcessRank(0, kWorld, &store), 0);
  for (size_t c = 0; c < children.size(); ++c) {
    int wstatus = 0;
    ASSERT_EQ(waitpid(children[c], &wstatus, 0), children[c]);
    EXPECT_TRUE(WIFEXITED(wstatus)) << "rank " << c + 1;
    EXPECT_EQ(WEXITSTATUS(wstatus), 0)
        << "rank " << c + 1 << " failed at collective " << WEXITSTATUS(wstatus);
  }
  EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
}

// A rank's process is killed (SIGKILL: no destructor runs) while this rank
// is in an allreduce with it: the allreduce fails with UNAVAILABLE naming
// the rank and its pid, well before the timeout; the killed process is not
// reaped meanwhile (a zombie still counts as exited).
TEST(ShmBackendProcessTest, KilledProcessFailsItsPeersPromptly) {
  const std::string dir = MakeStoreDir();
  ASSERT_FALSE(dir.empty());
  FileStore store(dir);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = testing::ForkRank([&] {
    auto backend =
        ShmBackend::Create(OptionsFor(1, 2, kHealthyTimeout), &store);
    if (!backend.ok()) return 100;
    std::vector<float> data(1000, 1.0f);
    if (!(*backend)
             ->AllReduce(BufferOf(data), ReduceOp::kSum)
             ->Wait(kBound)
             .ok()) {
      return 1;
    }
    // Tell the parent, then wait to be killed.
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) return 2;
    for (;;) pause();
  });
  ASSERT_GT(child, 0);
  auto backend = ShmBackend::Create(OptionsFor(0, 2, kHealthyTimeout), &store);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::vector<float> data(1000, 1.0f);
  ASSERT_TRUE(
      (*backend)->AllReduce(BufferOf(data), ReduceOp::kSum)->Wait(kBound).ok());
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);

  auto work = (*backend)->AllReduce(BufferOf(data), ReduceOp::kSum);
  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(child, SIGKILL), 0);
  absl::Status status = work->Wait(kBound);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(absl::StrCat("shm allreduce #2 (rank 0 of 2): rank 1 "
                                     "(pid ",
                                     child, ") exited")));
  EXPECT_LT(absl::Now() - start, kBound);
  absl::Status after = (*backend)->Barrier()->Wait(kBound);
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;

  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
  close(ready[0]);
  close(ready[1]);
  EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
}

// Whether process `pid` has a gradsync segment mapped and sleeps: a rank
// that sleeps with the segment mapped during bootstrap has attached and
// waits for the others.
bool AttachedAndWaiting(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::stringstream mapped;
  mapped << maps.rdbuf();
  if (!absl::StrContains(mapped.str(), "/dev/shm/gradsync-shm-")) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string pid_field, command, state;
  stat >> pid_field >> command >> state;  // no spaces in our command name
  return state == "S";
}

// A rank's process is killed during bootstrap after it attached: the rank
// still waiting for the others fails with UNAVAILABLE at once, not at its
// timeout, and removes the segment.
TEST(ShmBackendProcessTest,
     ProcessKilledDuringBootstrapFailsTheOthersPromptly) {
  const std::string dir = MakeStoreDir();
  ASSERT_FALSE(dir.empty());
  FileStore store(dir);
  // Ranks 0 and 1 of 3; rank 2 never comes, so both wait.
  const pid_t child = testing::ForkRank([&] {
    return ShmBackend::Create(OptionsFor(1, 3, kHealthyTimeout), &store).ok();
  });
  ASSERT_GT(child, 0);
  absl::Status rank0 = absl::UnknownError("not run");
  std::thread waiter([&] {
    rank0 =
        ShmBackend::Create(OptionsFor(0, 3, kHealthyTimeout), &store).status();
  });
  const bool attached =
      Eventually([&] { return AttachedAndWaiting(child); }, kBound);
  const absl::Time start = absl::Now();
  kill(child, SIGKILL);
  waiter.join();
  EXPECT_TRUE(attached) << "the child never attached";
  EXPECT_EQ(rank0.code(), absl::StatusCode::kUnavailable) << rank0;
  EXPECT_THAT(
      std::string(rank0.message()),
      HasSubstr(absl::StrCat("shm bootstrap (rank 0 of 3): rank 1 (pid ", child,
                             ") exited")));
  EXPECT_LT(absl::Now() - start, kBound);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
}

}  // namespace
}  // namespace gradsync
