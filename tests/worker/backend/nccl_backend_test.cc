// The NCCL backend's own logic, multi-rank, on the simulated device (CUDA's
// asynchrony in host memory, collectives over shared memory): ranks as
// threads of this process and as forked processes, world sizes 1-8 and
// element counts including 0, checked against closed forms; and what a GPU
// job meets when things fail: a hung peer, an asynchronous error after the
// host moved on, an abort mid-collective and during creation, and many
// abort + re-create cycles that must leave nothing behind.
#include "worker/backend/nccl_backend.h"

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/nccl_sim_group.h"
#include "worker/backend/file_store.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/nccl_faults.h"
#include "worker/backend/sim_device.h"
#include "worker/backend/store.h"

namespace gradsync {
namespace {

using ::gradsync::testing::BufferOf;
using ::gradsync::testing::ExpectAllOk;
using ::gradsync::testing::ExpectElements;
using ::gradsync::testing::FaultAt;
using ::gradsync::testing::kBig;
using ::gradsync::testing::kBound;
using ::gradsync::testing::kHealthyTimeout;
using ::gradsync::testing::OnEveryRank;
using ::gradsync::testing::OptionsFor;
using ::gradsync::testing::RankSum;
using ::gradsync::testing::SimDevices;
using ::gradsync::testing::StartNcclGroup;
using ::testing::AnyOf;
using ::testing::Combine;
using ::testing::HasSubstr;
using ::testing::Values;

// ---------------------------------------------------------------------------
// Results against closed forms: world sizes 5-8 here (1-4, with the
// scenarios every backend passes, in backend_conformance_test).

constexpr size_t kCounts[] = {0, 1, 7, 1000};
// Past one transport slot (1 MiB a rank): the collective runs in chunks.
// The costliest count, so run at a spread of world sizes only.
constexpr size_t kChunkedCount = (1 << 18) + 3;

class NcclSimCollectivesTest
    : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(NcclSimCollectivesTest, EveryCollectiveMatchesItsClosedForm) {
  const auto [world, count] = GetParam();
  auto devices = SimDevices(world);
  InMemoryStore store;
  auto group = StartNcclGroup(devices, &store);
  ASSERT_EQ(group.size(), static_cast<size_t>(world));
  OnEveryRank(world, [&, world = world, count = count](int rank) {
    Backend& b = *group[rank];
    std::vector<float> sum(count), avg(count);
    std::vector<int64_t> ints(count);
    std::vector<double> bcast(count, rank);
    std::vector<int32_t> mine(count, rank + 1);
    std::vector<int32_t> all(count * world, -1);
    for (size_t i = 0; i < count; ++i) {
      sum[i] = avg[i] = static_cast<float>(rank * 3 + i % 17);
      ints[i] = rank * kBig + static_cast<int64_t>(i);
    }
    ExpectAllOk({b.AllReduce(BufferOf(sum), ReduceOp::kSum),
                 b.AllReduce(BufferOf(avg), ReduceOp::kAverage),
                 b.AllReduce(BufferOf(ints), ReduceOp::kSum),
                 b.Broadcast(BufferOf(bcast), world - 1),
                 b.AllGather(BufferOf(mine), BufferOf(all)), b.Barrier()});
    ExpectElements(sum, [&](size_t i) {
      return 3.0 * RankSum(world) + world * static_cast<double>(i % 17);
    }, "allreduce sum");
    ExpectElements(avg, [&](size_t i) {
      return (3.0 * RankSum(world) + world * static_cast<double>(i % 17)) /
             world;
    }, "allreduce average");
    ExpectElements(ints, [&](size_t i) {
      return kBig * RankSum(world) + world * static_cast<int64_t>(i);
    }, "allreduce int64");
    ExpectElements(bcast, [&](size_t) { return world - 1; }, "broadcast");
    ExpectElements(all, [&](size_t i) { return 1 + i / count; }, "allgather");
  });
}

INSTANTIATE_TEST_SUITE_P(
    Sim, NcclSimCollectivesTest,
    Combine(::testing::Range(5, 9), ::testing::ValuesIn(kCounts)),
    testing::WorldAndCountName);
INSTANTIATE_TEST_SUITE_P(SimChunked, NcclSimCollectivesTest,
                         Combine(Values(1, 2, 3, 5, 8), Values(kChunkedCount)),
                         testing::WorldAndCountName);

// A slow rank delays the others' collectives but changes no result.
TEST(NcclSimTest, ASlowRankDelaysButDoesNotChangeResults) {
  auto devices = SimDevices(3);
  InMemoryStore store;
  auto group = StartNcclGroup(devices, &store, kHealthyTimeout, [](int rank) {
    return [rank](uint64_t) {
      CommFault fault;
      if (rank == 1) {
        fault.kind = CommFault::Kind::kDelay;
        fault.delay = absl::Milliseconds(30);
      }
      return fault;
    };
  });
  ASSERT_EQ(group.size(), 3u);
  const absl::Time start = absl::Now();
  OnEveryRank(3, [&](int rank) {
    std::vector<float> data(100, rank + 1.0f);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(group[rank]->AllReduce(BufferOf(data), ReduceOp::kSum)
                      ->Wait(kBound)
                      .ok());
    }
    ExpectElements(data, [](size_t) { return 6 * 3 * 3; }, "sums");
  });
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
}

// ---------------------------------------------------------------------------
// Failures.

// Rank 2 issues only the first of three all-reduces: the others' second is
// found hung by their watchdogs at the timeout, every pending Work fails
// (the third too, without waiting another timeout), and nothing hangs.
TEST(NcclSimFailureTest, AHungPeerFailsEveryPendingWorkWithinTheTimeout) {
  constexpr absl::Duration kTimeout = absl::Seconds(1);
  auto devices = SimDevices(3);
  InMemoryStore store;
  auto group = StartNcclGroup(devices, &store, kTimeout);
  ASSERT_EQ(group.size(), 3u);
  std::vector<std::vector<float>> data(3, std::vector<float>(64, 1.0f));
  std::vector<std::shared_ptr<Work>> first, later;
  const absl::Time start = absl::Now();
  for (int rank = 0; rank < 3; ++rank) {
    first.push_back(group[rank]->AllReduce(BufferOf(data[rank]), ReduceOp::kSum));
  }
  ExpectAllOk(first);
  for (int rank = 0; rank < 2; ++rank) {
    for (int i = 0; i < 2; ++i) {
      later.push_back(
          group[rank]->AllReduce(BufferOf(data[rank]), ReduceOp::kSum));
    }
  }
  for (const auto& work : later) {
    absl::Status status = work->Wait(kTimeout + kBound);
    EXPECT_THAT(status.code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                     absl::StatusCode::kUnavailable,
                                     absl::StatusCode::kAborted))
        << status;
  }
  // Whichever rank's watchdog fires first names the timeout; the other may
  // see that rank leave first (UNAVAILABLE).
  bool named = false;
  for (const auto& work : later) {
    named = named || absl::StrContains(work->status().message(),
                                       "did not complete within");
  }
  EXPECT_TRUE(named) << later[0]->status() << "; " << later[2]->status();
  EXPECT_LT(absl::Now() - start, kTimeout + kBound);
  // After the abort every collective fails at once with ABORTED (the round
  // must be re-formed, which is recoverable), naming the first error.
  absl::Status after =
      group[0]->AllReduce(BufferOf(data[0]), ReduceOp::kSum)->Wait(kBound);
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
  EXPECT_THAT(after.message(), HasSubstr("re-formed"));
  group.clear();  // nothing hangs while destroying
}

// Rank 1's third collective fails asynchronously after the host moved on:
// the call returned a pending Work; the Work then fails (the error the
// device reported), the communicator is aborted, and the peers, waiting in
// that collective for rank 1, fail promptly rather than at their timeout.
TEST(NcclSimFailureTest, AnAsyncErrorAfterTheHostMovedOnFailsThatWork) {
  auto devices = SimDevices(3);
  InMemoryStore store;
  auto group = StartNcclGroup(devices, &store, kHealthyTimeout, [](int rank) {
    return rank == 1 ? FaultAt(3, CommFault::Kind::kAsyncError) : nullptr;
  });
  ASSERT_EQ(group.size(), 3u);
  std::vector<std::vector<float>> data(3, std::vector<float>(4096, 1.0f));
  std::vector<std::shared_ptr<Work>> third(3);
  const absl::Time start = absl::Now();
  OnEveryRank(3, [&](int rank) {
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(group[rank]->AllReduce(BufferOf(data[rank]), ReduceOp::kSum)
                      ->Wait(kBound)
                      .ok());
    }
    third[rank] = group[rank]->AllReduce(BufferOf(data[rank]), ReduceOp::kSum);
  });
  absl::Status failed = third[1]->Wait(kBound);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("injected asynchronous error"));
  // Rank 1's buffer was not reduced: a step built on it must not count.
  ExpectElements(data[1], [](size_t) { return 9; }, "rank 1's unreduced data");
  for (int rank : {0, 2}) {
    absl::Status peer = third[rank]->Wait(kBound);
    EXPECT_FALSE(peer.ok()) << "rank " << rank;
  }
  EXPECT_LT(absl::Now() - start, kBound);
}

// An injected hang holds the stream until the owner aborts: Abort() ends
// the collective in flight at once and the peers' with it.
TEST(NcclSimFailureTest, AbortEndsAHungCollectiveAndThePeers) {
  auto devices = SimDevices(2);
  InMemoryStore store;
  auto group = StartNcclGroup(devices, &store, kHealthyTimeout, [](int rank) {
    return rank == 0 ? FaultAt(1, CommFault::Kind::kHang) : nullptr;
  });
  ASSERT_EQ(group.size(), 2u);
  std::vector<std::vector<float>> data(2, std::vector<float>(16, 1.0f));
  auto hung = group[0]->AllReduce(BufferOf(data[0]), ReduceOp::kSum);
  auto peer = group[1]->AllReduce(BufferOf(data[1]), ReduceOp::kSum);
  EXPECT_EQ(hung->Wait(absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);  // still hung
  const absl::Time start = absl::Now();
  group[0]->Abort();
  EXPECT_EQ(hung->Wait(kBound).code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(peer->Wait(kBound).ok());
  EXPECT_LT(absl::Now() - start, kBound);
}

// An abort fails a pending Work only once the device is done with its
// buffer, so a caller may free the buffer when Wait() returns: here rank
// 0's stream still holds its collective (an injected 300 ms delay before
// it) when its owner aborts, and the Work ends only after the stream moved
// past it. (An earlier finish let a worker free a bucket that the aborted
// collective then wrote into, corrupting the heap.)
TEST(NcclSimFailureTest, AnAbortedWorkEndsOnlyOnceTheDeviceIsDoneWithIt) {
  constexpr absl::Duration kHeld = absl::Milliseconds(300);
  auto devices = SimDevices(2);
  InMemoryStore store;
  auto group = StartNcclGroup(
      devices, &store, kHealthyTimeout, [&](int rank) -> CommFaultPlan {
        if (rank != 0) return nullptr;
        return [kHeld](uint64_t n) {
          CommFault fault;
          if (n == 1) {
            fault.kind = CommFault::Kind::kDelay;
            fault.delay = kHeld;
          }
          return fault;
        };
      });
  ASSERT_EQ(group.size(), 2u);
  std::vector<float> data(16, 1.0f);
  const absl::Time start = absl::Now();
  auto held = group[0]->AllReduce(BufferOf(data), ReduceOp::kSum);
  group[0]->Abort();
  EXPECT_EQ(held->Wait(kBound).code(), absl::StatusCode::kAborted);
  EXPECT_GE(absl::Now() - start, kHeld) << "finished before the device";
  // A backend destroyed with a collective on its stream waits for it too.
  auto queued = group[1]->AllReduce(BufferOf(data), ReduceOp::kSum);
  group[1].reset();
  EXPECT_TRUE(queued->IsCompleted());
  EXPECT_FALSE(queued->Wait(kBound).ok());  // its peer aborted
}

// Rank 1 never creates its communicator: rank 0's creation fails at its
// timeout, naming the wait, or at once when aborted from another thread.
TEST(NcclSimFailureTest, CreationEndsAtTheTimeoutOrAtAnAbort) {
  auto devices = SimDevices(2);
  {
    InMemoryStore store;
    auto backend = NcclBackend::Create(OptionsFor(0, 2, absl::Seconds(1)),
                                       NcclOptions{devices[0].get()});
    ASSERT_TRUE(backend.ok());
    absl::Status connected = (*backend)->Connect(&store);
    EXPECT_EQ(connected.code(), absl::StatusCode::kDeadlineExceeded)
        << connected;
    EXPECT_THAT(connected.message(),
                HasSubstr("communicator creation on sim:0"));
  }
  InMemoryStore store;
  auto backend = NcclBackend::Create(OptionsFor(0, 2, kHealthyTimeout),
                                     NcclOptions{devices[0].get()});
  ASSERT_TRUE(backend.ok());
  const absl::Time start = absl::Now();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    (*backend)->Abort();
  });
  absl::Status connected = (*backend)->Connect(&store);
  aborter.join();
  EXPECT_EQ(connected.code(), absl::StatusCode::kAborted) << connected;
  EXPECT_LT(absl::Now() - start, kBound);
}

// What this process holds: threads, file descriptors.
int CountEntries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// 20 times: a group of 3 reduces, rank 0 aborts while the others wait in a
// collective with it, and a new group on the same devices reduces again.
// Afterwards this process holds the threads, descriptors and device memory
// it held before.
TEST(NcclSimFailureTest, AbortAndRecreateLeavesNothingBehind) {
  auto devices = SimDevices(3);
  auto cycle = [&] {
    InMemoryStore store;
    auto group = StartNcclGroup(devices, &store);
    ASSERT_EQ(group.size(), 3u);
    std::vector<std::vector<float>> data(3, std::vector<float>(1000, 1.0f));
    OnEveryRank(3, [&](int rank) {
      ASSERT_TRUE(group[rank]->AllReduce(BufferOf(data[rank]), ReduceOp::kSum)
                      ->Wait(kBound)
                      .ok());
    });
    auto waiting1 = group[1]->AllReduce(BufferOf(data[1]), ReduceOp::kSum);
    auto waiting2 = group[2]->AllReduce(BufferOf(data[2]), ReduceOp::kSum);
    group[0]->Abort();
    EXPECT_FALSE(waiting1->Wait(kBound).ok());
    EXPECT_FALSE(waiting2->Wait(kBound).ok());
  };
  cycle();  // the first cycle may create what lives for the process
  const int threads = CountEntries("/proc/self/task");
  const int fds = CountEntries("/proc/self/fd");
  std::vector<int64_t> memory;
  for (const auto& device : devices) memory.push_back(device->MemoryInUse());
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(absl::StrCat("cycle ", i));
    cycle();
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_EQ(CountEntries("/proc/self/task"), threads);
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds);
  for (size_t d = 0; d < devices.size(); ++d) {
    EXPECT_EQ(devices[d]->MemoryInUse(), memory[d]) << devices[d]->name();
  }
}

// ---------------------------------------------------------------------------
// Ranks as processes: each process has its own simulated device and they
// share the transport's memory across processes.

// The element counts every process-rank checks, in turn on one backend:
// none, a few (odd), and many.
constexpr size_t kProcessCounts[] = {0, 7, 50'001};

// One process-rank: its own simulated device and backend, then the shared
// list of checked collectives at each of kProcessCounts; 0 when all are
// right (the exit code), else the first wrong collective's number, the
// count named on stderr.
int RunProcessRank(int rank, int world_size, Store* store) {
  auto device = CreateSimDevice(rank);
  if (!device.ok()) return 100;
  auto backend = CreateNcclBackend(OptionsFor(rank, world_size, kHealthyTimeout),
                                   store, NcclOptions{device->get()});
  if (!backend.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 backend.status().ToString().c_str());
    return 101;
  }
  for (size_t count : kProcessCounts) {
    const int wrong = testing::CheckCollectivesOfAProcessRank(**backend, count);
    if (wrong != 0) {
      std::fprintf(stderr, "rank %d: collective %d of %zu elements wrong\n",
                   rank, wrong, count);
      return wrong;
    }
  }
  return 0;
}

TEST(NcclSimProcessTest, RanksInSeparateProcessesAgreeAtEveryCount) {
  constexpr int kWorld = 3;
  absl::StatusOr<std::string> dir = FileStore::MakeDirectory("nccl_sim_test");
  ASSERT_TRUE(dir.ok()) << dir.status();
  FileStore store(*dir);
  std::vector<pid_t> children;
  for (int rank = 0; rank < kWorld; ++rank) {
    children.push_back(testing::ForkRank(
        [&, rank] { return RunProcessRank(rank, kWorld, &store); }));
    ASSERT_GT(children.back(), 0);
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    int wstatus = 0;
    ASSERT_EQ(waitpid(children[rank], &wstatus, 0), children[rank]);
    ASSERT_TRUE(WIFEXITED(wstatus)) << "rank " << rank;
    EXPECT_EQ(WEXITSTATUS(wstatus), 0)
        << "rank " << rank << " failed at collective " << WEXITSTATUS(wstatus);
  }
}

}  // namespace
}  // namespace gradsync
