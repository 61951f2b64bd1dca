// What the tests of every Backend share: ranks as threads of the test
// process, buffers over vectors, element-for-element checks, and scenarios
// that any backend must pass (run them on a started group of any size).
#ifndef GRADSYNC_TESTS_WORKER_BACKEND_BACKEND_TEST_UTIL_H_
#define GRADSYNC_TESTS_WORKER_BACKEND_BACKEND_TEST_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/backend.h"
#include "worker/backend/work.h"

namespace gradsync {
namespace testing {

// The backend timeout of tests where every rank takes part: long enough
// never to fire on a loaded machine.
inline constexpr absl::Duration kHealthyTimeout = absl::Seconds(20);
// How long a test waits for something that must happen (well below
// kHealthyTimeout, so a failure that should be prompt cannot be a timeout).
inline constexpr absl::Duration kBound = absl::Seconds(8);
// A bounded wait for something that cannot happen yet.
inline constexpr absl::Duration kBriefly = absl::Milliseconds(50);
// Makes int64 values need all 64 bits; odd, so averages truncate.
inline constexpr int64_t kBig = 1'000'000'000'007;

// The DataType of element type T; a test specializes it for its own types
// (e.g. 16-bit floats).
template <typename T>
struct DtypeOf;
template <>
struct DtypeOf<float> {
  static constexpr DataType kType = DataType::kFloat32;
};
template <>
struct DtypeOf<double> {
  static constexpr DataType kType = DataType::kFloat64;
};
template <>
struct DtypeOf<int32_t> {
  static constexpr DataType kType = DataType::kInt32;
};
template <>
struct DtypeOf<int64_t> {
  static constexpr DataType kType = DataType::kInt64;
};
template <>
struct DtypeOf<uint8_t> {
  static constexpr DataType kType = DataType::kUInt8;
};

// How an element is printed in failures: numbers, never characters. A test
// specializes it for types `+` does not print.
template <typename T>
struct ElementPrinter {
  static auto Print(T value) { return +value; }
};

// A CPU Buffer over `values` (which must outlive the collective).
template <typename T>
Buffer BufferOf(std::vector<T>& values) {
  Buffer buffer;
  buffer.data = values.data();
  buffer.count = values.size();
  buffer.dtype = DtypeOf<T>::kType;
  return buffer;
}

// Fails the test unless got[i] == expected(i) for every i; reports the
// number of wrong elements and the first one.
template <typename T, typename Expected>
void ExpectElements(const std::vector<T>& got, Expected expected,
                    const std::string& what) {
  size_t wrong = 0;
  size_t first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == static_cast<T>(expected(i)))) {
      if (wrong++ == 0) first = i;
    }
  }
  EXPECT_EQ(wrong, 0u) << what << ": " << wrong << " of " << got.size()
                       << " elements wrong; first at " << first << ": got "
                       << ElementPrinter<T>::Print(got[first]) << ", expected "
                       << ElementPrinter<T>::Print(
                              static_cast<T>(expected(first)));
}

inline BackendOptions OptionsFor(int rank, int world_size,
                                 absl::Duration timeout) {
  BackendOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.timeout = timeout;
  return options;
}

// Runs fn(rank) on one thread per rank and joins them.
inline void OnEveryRank(int world_size,
                        const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back(fn, rank);
  }
  for (std::thread& thread : threads) thread.join();
}

// Creates the backends of `world_size` ranks with create(rank), each on its
// own thread, so that they bootstrap concurrently. Empty (and the test
// failed) if any rank could not.
template <typename B>
std::vector<std::unique_ptr<B>> StartGroup(
    int world_size,
    const std::function<absl::StatusOr<std::unique_ptr<B>>(int rank)>& create) {
  std::vector<absl::StatusOr<std::unique_ptr<B>>> created;
  for (int rank = 0; rank < world_size; ++rank) {
    created.emplace_back(absl::UnknownError("not created"));
  }
  OnEveryRank(world_size, [&](int rank) { created[rank] = create(rank); });
  std::vector<std::unique_ptr<B>> backends;
  for (int rank = 0; rank < world_size; ++rank) {
    EXPECT_TRUE(created[rank].ok())
        << "rank " << rank << ": " << created[rank].status();
    if (!created[rank].ok()) return {};
    backends.push_back(std::move(*created[rank]));
  }
  return backends;
}

// The backends of a group, as the scenarios below take them.
template <typename B>
std::vector<Backend*> Pointers(const std::vector<std::unique_ptr<B>>& group) {
  std::vector<Backend*> pointers;
  for (const auto& backend : group) pointers.push_back(backend.get());
  return pointers;
}

// Waits (up to kBound each) for every Work and fails the test for each one
// that did not finish OK.
inline void ExpectAllOk(const std::vector<std::shared_ptr<Work>>& works) {
  for (const auto& work : works) {
    EXPECT_TRUE(work->Wait(kBound).ok())
        << "collective #" << work->sequence() << ": " << work->Wait(kBound);
  }
}

// Sum over ranks r of r: n(n-1)/2.
inline int64_t RankSum(int n) { return static_cast<int64_t>(n) * (n - 1) / 2; }

// Test names of suites parameterized over world size ("world3") and over
// world size x element count ("world3_count1000").
inline std::string WorldName(const ::testing::TestParamInfo<int>& info) {
  return absl::StrCat("world", info.param);
}
inline std::string WorldAndCountName(
    const ::testing::TestParamInfo<std::tuple<int, size_t>>& info) {
  return absl::StrCat("world", std::get<0>(info.param), "_count",
                      std::get<1>(info.param));
}

// ---------------------------------------------------------------------------
// Scenarios. Each takes a started group (rank r's backend at index r) that
// has issued no collective yet.

// Broadcasts of `count` doubles from every root in turn, issued back to back
// and then waited for: every rank ends with the root's data.
void ExpectBroadcastFromEveryRoot(const std::vector<Backend*>& backends,
                                  size_t count);

// An allgather of `count` int32 per rank: every rank ends with every rank's
// input, in rank order.
void ExpectAllGatherInRankOrder(const std::vector<Backend*>& backends,
                                size_t count);

// A barrier does not complete before the last rank enters it.
void ExpectBarrierWaitsForEveryRank(const std::vector<Backend*>& backends);

// Rank 0's barrier waits for the others, who never come; Abort() from this
// thread ends it at once (not at the timeout), rank 0's later collectives
// fail, and with 2 ranks the peer's collective with it fails too.
void ExpectAbortEndsTheCollectiveInFlight(const std::vector<Backend*>& backends);

// Rank 0's all-reduce, which the others never join: Backend::Await gives
// up after its (brief) timeout and returns only once the collective ended,
// the backend aborted, so that its buffer may go.
void ExpectAwaitEndsACollectiveThatTimedOut(
    const std::vector<Backend*>& backends);

// Each rank issues `collectives` collectives of every kind and of sizes from
// 0 to `max_size` elements from its own thread without waiting in between,
// then waits for all: every one completes, in issue order, with the right
// result.
void ExpectManyCollectivesCompleteInOrder(const std::vector<Backend*>& backends,
                                          int collectives, size_t max_size);

// A collective of zero elements waits its turn: it does not complete before
// a collective issued earlier.
void ExpectEmptyCollectiveWaitsForEarlierOnes(
    const std::vector<Backend*>& backends);

// Forks a child that runs `body` and exits with what it returns (0:
// success); the parent gets its pid (-1 when fork failed). Call it before
// starting threads of one's own.
pid_t ForkRank(const std::function<int()>& body);

// What one rank of a group of processes runs: an all-reduce sum of `count`
// float32, an all-reduce average of `count` int64, a broadcast of `count`
// doubles from the last rank, an all-gather of count/10 (rounded up) int32
// per rank and a barrier, each checked against its closed form. 0 when
// every one is right, else the number (1-5) of the first that failed or was
// wrong (a process's exit code).
int CheckCollectivesOfAProcessRank(Backend& b, size_t count = 50'001);

// Every argument error every backend checks (buffers on the wrong device or
// without data, allgather sizes, broadcast roots) fails at once with
// INVALID_ARGUMENT and consumes no sequence number. Needs 2 ranks.
void ExpectBadArgumentsFailAtOnce(const std::vector<Backend*>& backends);

}  // namespace testing
}  // namespace gradsync

#endif  // GRADSYNC_TESTS_WORKER_BACKEND_BACKEND_TEST_UTIL_H_
