// What every Backend must do, run on each of them alike: Gloo, shared
// memory and NCCL on the simulated device (sim_device.h), ranks as threads
// of this process. Every collective over backend x world size x element
// count (0, 1, odd sizes, past one shared-memory slot), checked against
// closed forms; and over backend x world size: barriers, abort of a
// collective in flight, long mixes issued back to back, empty collectives
// in order, argument errors; and the options every backend checks when it
// is created. What only one backend has (its dtypes, its
// bootstrap and peer-death paths, its processes) stays in its own test.
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/nccl_sim_group.h"
#include "worker/backend/backend.h"
#include "worker/backend/gloo_backend.h"
#include "worker/backend/nccl_backend.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/shm_backend.h"
#include "worker/backend/store.h"

namespace gradsync {
namespace {

using ::gradsync::testing::BufferOf;
using ::gradsync::testing::ExpectAllOk;
using ::gradsync::testing::ExpectElements;
using ::gradsync::testing::kBig;
using ::gradsync::testing::kBound;
using ::gradsync::testing::kHealthyTimeout;
using ::gradsync::testing::OptionsFor;
using ::gradsync::testing::RankSum;
using ::testing::Combine;
using ::testing::HasSubstr;
using ::testing::Values;

enum class Kind { kGloo, kShm, kNcclSim };

std::string KindName(Kind kind) {
  switch (kind) {
    case Kind::kGloo:
      return "Gloo";
    case Kind::kShm:
      return "Shm";
    case Kind::kNcclSim:
      break;
  }
  return "NcclSim";
}

// The backends of one group and what they need to outlive them.
struct Group {
  InMemoryStore store;
  std::vector<std::unique_ptr<NcclDevice>> devices;  // NCCL only
  std::vector<std::unique_ptr<Backend>> backends;

  std::vector<Backend*> pointers() const {
    return ::gradsync::testing::Pointers(backends);
  }
};

template <typename B>
std::vector<std::unique_ptr<Backend>> Upcast(
    std::vector<std::unique_ptr<B>> group) {
  std::vector<std::unique_ptr<Backend>> backends;
  for (auto& b : group) backends.push_back(std::move(b));
  return backends;
}

// Starts `world_size` ranks of `kind`; shared memory with 4 KiB slots, so
// that the larger counts run in chunks.
void Start(Kind kind, int world_size, Group* group) {
  switch (kind) {
    case Kind::kGloo:
      group->backends = Upcast(::gradsync::testing::StartGroup<GlooBackend>(
          world_size, [&](int rank) {
            return GlooBackend::Create(
                OptionsFor(rank, world_size, kHealthyTimeout), &group->store);
          }));
      return;
    case Kind::kShm:
      group->backends = Upcast(::gradsync::testing::StartGroup<ShmBackend>(
          world_size, [&](int rank) {
            ShmOptions shm;
            shm.slot_bytes = 4096;
            return ShmBackend::Create(
                OptionsFor(rank, world_size, kHealthyTimeout), &group->store,
                shm);
          }));
      return;
    case Kind::kNcclSim:
      group->devices = ::gradsync::testing::SimDevices(world_size);
      group->backends = Upcast(
          ::gradsync::testing::StartNcclGroup(group->devices, &group->store));
      return;
  }
}

// ---------------------------------------------------------------------------
// Every collective, over backend x world size x element count.

class CollectiveConformanceTest
    : public ::testing::TestWithParam<std::tuple<Kind, int, size_t>> {
 protected:
  void SetUp() override {
    Start(kind(), world_size(), &group_);
    ASSERT_EQ(static_cast<int>(group_.backends.size()), world_size());
  }

  Kind kind() const { return std::get<0>(GetParam()); }
  int world_size() const { return std::get<1>(GetParam()); }
  size_t count() const { return std::get<2>(GetParam()); }

  // All-reduces value(r, i) on every rank r with `op` and checks that every
  // rank ends with expected(i).
  template <typename T, typename Value, typename Expected>
  void CheckAllReduce(ReduceOp op, Value value, Expected expected) {
    std::vector<std::vector<T>> buffers(world_size(), std::vector<T>(count()));
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < world_size(); ++r) {
      for (size_t i = 0; i < count(); ++i) buffers[r][i] = value(r, i);
      works.push_back(group_.backends[r]->AllReduce(BufferOf(buffers[r]), op));
    }
    ExpectAllOk(works);
    for (int r = 0; r < world_size(); ++r) {
      ExpectElements(buffers[r], expected,
                     absl::StrCat(op == ReduceOp::kSum ? "sum" : "average",
                                  ", rank ", r));
    }
  }

  Group group_;
};

// Values exact in float32, and so are their sums and averages.
TEST_P(CollectiveConformanceTest, AllReduceOfFloat32) {
  const int n = world_size();
  auto value = [](int r, size_t i) { return static_cast<float>(r * 1000 + i); };
  CheckAllReduce<float>(ReduceOp::kSum, value, [n](size_t i) {
    return static_cast<double>(n * i + 1000 * RankSum(n));
  });
  CheckAllReduce<float>(ReduceOp::kAverage, value, [n](size_t i) {
    return static_cast<double>(i + 500 * (n - 1));
  });
}

// Values that need all 64 bits; averages truncate.
TEST_P(CollectiveConformanceTest, AllReduceOfInt64) {
  const int n = world_size();
  auto value = [](int r, size_t i) {
    return r * kBig + static_cast<int64_t>(i);
  };
  CheckAllReduce<int64_t>(ReduceOp::kSum, value, [n](size_t i) {
    return n * static_cast<int64_t>(i) + kBig * RankSum(n);
  });
  CheckAllReduce<int64_t>(ReduceOp::kAverage, value, [n](size_t i) {
    return static_cast<int64_t>(i) + kBig * RankSum(n) / n;
  });
}

TEST_P(CollectiveConformanceTest, BroadcastFromEveryRoot) {
  ::gradsync::testing::ExpectBroadcastFromEveryRoot(group_.pointers(),
                                                    count());
}

TEST_P(CollectiveConformanceTest, AllGatherInRankOrder) {
  ::gradsync::testing::ExpectAllGatherInRankOrder(group_.pointers(), count());
}

// Element counts: empty, one, sizes that do not divide evenly among the
// ranks, and past a 4 KiB shared-memory slot and a power of two.
constexpr size_t kCounts[] = {0, 1, 7, 1000, (1 << 16) + 3};

std::string CollectiveName(
    const ::testing::TestParamInfo<std::tuple<Kind, int, size_t>>& info) {
  return absl::StrCat(KindName(std::get<0>(info.param)), "_world",
                      std::get<1>(info.param), "_count",
                      std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveConformanceTest,
                         Combine(Values(Kind::kGloo, Kind::kShm,
                                        Kind::kNcclSim),
                                 Values(1, 2, 3, 4),
                                 ::testing::ValuesIn(kCounts)),
                         CollectiveName);

// ---------------------------------------------------------------------------
// Behaviour that depends on the world size only.

class GroupConformanceTest
    : public ::testing::TestWithParam<std::tuple<Kind, int>> {
 protected:
  void SetUp() override {
    Start(std::get<0>(GetParam()), world_size(), &group_);
    ASSERT_EQ(static_cast<int>(group_.backends.size()), world_size());
  }
  int world_size() const { return std::get<1>(GetParam()); }

  Group group_;
};

TEST_P(GroupConformanceTest, BarrierCompletesOnlyOnceEveryRankEntered) {
  ::gradsync::testing::ExpectBarrierWaitsForEveryRank(group_.pointers());
}

TEST_P(GroupConformanceTest, AbortEndsTheCollectiveInFlight) {
  ::gradsync::testing::ExpectAbortEndsTheCollectiveInFlight(group_.pointers());
}

TEST_P(GroupConformanceTest, AwaitEndsACollectiveThatTimedOut) {
  ::gradsync::testing::ExpectAwaitEndsACollectiveThatTimedOut(
      group_.pointers());
}

// Sizes up to 1,530 elements: up to 3 shared-memory slots of int64.
TEST_P(GroupConformanceTest, ManyCollectivesIssuedBackToBackCompleteInOrder) {
  ::gradsync::testing::ExpectManyCollectivesCompleteInOrder(
      group_.pointers(), /*collectives=*/60, /*max_size=*/1530);
}

// A collective of zero elements touches no data yet waits its turn.
TEST_P(GroupConformanceTest, EmptyCollectiveWaitsForEarlierOnes) {
  ::gradsync::testing::ExpectEmptyCollectiveWaitsForEarlierOnes(
      group_.pointers());
}

INSTANTIATE_TEST_SUITE_P(
    Backends, GroupConformanceTest,
    Combine(Values(Kind::kGloo, Kind::kShm, Kind::kNcclSim),
            Values(1, 2, 3, 4, 8)),
    [](const ::testing::TestParamInfo<std::tuple<Kind, int>>& info) {
      return absl::StrCat(KindName(std::get<0>(info.param)), "_world",
                          std::get<1>(info.param));
    });

// Argument errors, with 2 ranks.
class ArgumentConformanceTest : public ::testing::TestWithParam<Kind> {};

TEST_P(ArgumentConformanceTest, BadArgumentsFailAtOnceAndUseNoSequenceNumber) {
  Group group;
  Start(GetParam(), 2, &group);
  ASSERT_EQ(group.backends.size(), 2u);
  ::gradsync::testing::ExpectBadArgumentsFailAtOnce(group.pointers());
}

INSTANTIATE_TEST_SUITE_P(Backends, ArgumentConformanceTest,
                         Values(Kind::kGloo, Kind::kShm, Kind::kNcclSim),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return KindName(info.param);
                         });

// ---------------------------------------------------------------------------
// Creation: the options every backend checks alike, refused before anything
// is made.

absl::Status CreateWith(Kind kind, const BackendOptions& options) {
  InMemoryStore store;
  switch (kind) {
    case Kind::kGloo:
      return GlooBackend::Create(options, &store).status();
    case Kind::kShm:
      return ShmBackend::Create(options, &store).status();
    case Kind::kNcclSim:
      break;
  }
  std::vector<std::unique_ptr<NcclDevice>> devices =
      ::gradsync::testing::SimDevices(1);
  NcclOptions nccl;
  nccl.device = devices[0].get();
  return NcclBackend::Create(options, nccl).status();
}

class CreateConformanceTest : public ::testing::TestWithParam<Kind> {};

TEST_P(CreateConformanceTest, BadCommonOptionsAreRefused) {
  struct Case {
    const char* what;
    BackendOptions options;
    const char* message;
  };
  const Case cases[] = {
      {"rank past the world", OptionsFor(2, 2, kBound),
       "rank 2 is not in [0, 2)"},
      {"negative rank", OptionsFor(-1, 2, kBound), "rank -1 is not in [0, 2)"},
      {"empty world", OptionsFor(0, 0, kBound), "world size 0 is not positive"},
      {"zero timeout", OptionsFor(0, 1, absl::ZeroDuration()),
       "timeout 0 is not positive"},
  };
  for (const Case& c : cases) {
    const absl::Status created = CreateWith(GetParam(), c.options);
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument)
        << c.what << ": " << created;
    EXPECT_THAT(std::string(created.message()), HasSubstr(c.message))
        << c.what;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CreateConformanceTest,
                         Values(Kind::kGloo, Kind::kShm, Kind::kNcclSim),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return KindName(info.param);
                         });

}  // namespace
}  // namespace gradsync
