// Tests of GlooBackend: N ranks as N threads of this process, bootstrapping
// concurrently through one InMemoryStore (and, once, through a real
// coordinator), over loopback TCP. Results are checked against closed forms.
// What every backend does alike is in backend_conformance_test; here, what
// is Gloo's own: its dtypes, bootstrap, timeouts and peer deaths.
#include "worker/backend/gloo_backend.h"
#include "worker/backend/float16.h"

#include <gloo/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/kv.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "server/coordinator.h"
#include "tests/worker/backend/backend_test_util.h"
#include "worker/backend/backend.h"
#include "worker/backend/store.h"
#include "worker/backend/work.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/runtime/coordinator_store.h"

namespace gradsync {
namespace testing {
// gloo's own half type, for float16 sums (its == compares bits).
template <>
struct DtypeOf<gloo::float16> {
  static constexpr DataType kType = DataType::kFloat16;
};
template <>
struct ElementPrinter<gloo::float16> {
  static float Print(gloo::float16 value) { return gloo::cpu_half2float(value); }
};
}  // namespace testing

namespace {

using ::gradsync::testing::BufferOf;
using ::gradsync::testing::DtypeOf;
using ::gradsync::testing::ExpectAllOk;
using ::gradsync::testing::ExpectElements;
using ::gradsync::testing::kBound;
using ::gradsync::testing::kBriefly;
using ::gradsync::testing::kHealthyTimeout;
using ::gradsync::testing::OnEveryRank;
using ::gradsync::testing::OptionsFor;
using ::gradsync::testing::RankSum;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Values;

// Creates the backends of `world_size` ranks, each on its own thread, so
// that they bootstrap concurrently through `store`. Empty (and the test
// failed) if any rank could not.
std::vector<std::unique_ptr<GlooBackend>> StartGroup(
    int world_size, Store* store, absl::Duration timeout = kHealthyTimeout) {
  return ::gradsync::testing::StartGroup<GlooBackend>(
      world_size, [&](int rank) {
        return GlooBackend::Create(OptionsFor(rank, world_size, timeout),
                                   store);
      });
}

// The collectives every backend has, the barrier, abort, ordering and
// argument errors: backend_conformance_test.

// ---------------------------------------------------------------------------
// Gloo's dtypes, over world size.

class GlooGroupTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    backends_ = StartGroup(world_size(), &store_);
    ASSERT_EQ(static_cast<int>(backends_.size()), world_size());
  }

  int world_size() const { return GetParam(); }

  InMemoryStore store_;
  std::vector<std::unique_ptr<GlooBackend>> backends_;
};

// Sum and average of every dtype the backend reduces.
TEST_P(GlooGroupTest, AllReduceOfEveryDtype) {
  const int n = world_size();
  constexpr size_t kCount = 7;
  // Rank r holds r + (i % 8): small integers, exact in every dtype.
  auto run = [&](auto zero, ReduceOp op, auto expected) {
    using T = decltype(zero);
    std::vector<std::vector<T>> buffers(n);
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < kCount; ++i) {
        buffers[r].push_back(static_cast<T>(r + static_cast<int>(i % 8)));
      }
      works.push_back(backends_[r]->AllReduce(BufferOf(buffers[r]), op));
    }
    ExpectAllOk(works);
    for (int r = 0; r < n; ++r) {
      ExpectElements(
          buffers[r], expected,
          absl::StrCat(DataTypeName(DtypeOf<T>::kType), " ",
                       op == ReduceOp::kSum ? "sum" : "average", ", rank ", r));
    }
  };
  auto sum = [n](size_t i) { return n * static_cast<int>(i % 8) + RankSum(n); };
  // Integers truncate; floats hold (n*k + n(n-1)/2) / n = k + (n-1)/2.
  auto int_average = [n](size_t i) {
    return static_cast<int>(i % 8) + RankSum(n) / n;
  };
  auto float_average = [n](size_t i) {
    return static_cast<int>(i % 8) + (n - 1) / 2.0;
  };
  run(float{}, ReduceOp::kSum, sum);
  run(double{}, ReduceOp::kSum, sum);
  run(int32_t{}, ReduceOp::kSum, sum);
  run(int64_t{}, ReduceOp::kSum, sum);
  run(uint8_t{}, ReduceOp::kSum, sum);
  run(float{}, ReduceOp::kAverage, float_average);
  run(double{}, ReduceOp::kAverage, float_average);
  run(int32_t{}, ReduceOp::kAverage, int_average);
  run(int64_t{}, ReduceOp::kAverage, int_average);
  run(uint8_t{}, ReduceOp::kAverage, int_average);

  // float16 through gloo's own half type (its == compares bits).
  auto half = [](double x) {
    return gloo::cpu_float2half_rn(static_cast<float>(x));
  };
  run(gloo::float16{}, ReduceOp::kSum, [&](size_t i) { return half(sum(i)); });
  run(gloo::float16{}, ReduceOp::kAverage,
      [&](size_t i) { return half(float_average(i)); });
}

// bfloat16 is summed through float, rounded to nearest: small integers and
// halves stay exact.
TEST_P(GlooGroupTest, AllReduceOfBFloat16) {
  const int n = world_size();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    std::vector<std::vector<uint16_t>> data(n);
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 5; ++i) {
        data[r].push_back(FloatToBFloat16(0.5f * i + r));
      }
      works.push_back(backends_[r]->AllReduce(
          Buffer{data[r].data(), data[r].size(), DataType::kBFloat16}, op));
    }
    ExpectAllOk(works);
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 5; ++i) {
        const float sum = 0.5f * i * n + RankSum(n);
        EXPECT_EQ(BFloat16ToFloat(data[r][i]),
                  op == ReduceOp::kSum ? sum : sum / n)
            << "rank " << r << " element " << i;
      }
    }
  }
}

// Broadcast and allgather move bytes, whatever the dtype.
TEST_P(GlooGroupTest, BroadcastAndAllGatherTakeBFloat16) {
  const int n = world_size();
  std::vector<std::vector<uint16_t>> data(n);
  std::vector<std::vector<uint16_t>> gathered(n, std::vector<uint16_t>(2 * n));
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < n; ++r) {
    data[r] = {static_cast<uint16_t>(r), static_cast<uint16_t>(0x3f80 + r)};
    Buffer input{data[r].data(), 2, DataType::kBFloat16};
    Buffer output{gathered[r].data(), gathered[r].size(), DataType::kBFloat16};
    works.push_back(backends_[r]->AllGather(input, output));
  }
  ExpectAllOk(works);
  works.clear();
  for (int r = 0; r < n; ++r) {
    works.push_back(backends_[r]->Broadcast(
        Buffer{data[r].data(), 2, DataType::kBFloat16}, n - 1));
  }
  ExpectAllOk(works);
  for (int r = 0; r < n; ++r) {
    ExpectElements(
        gathered[r],
        [](size_t k) { return k % 2 == 0 ? k / 2 : 0x3f80 + k / 2; },
        absl::StrCat("allgather, rank ", r));
    ExpectElements(
        data[r], [n](size_t k) { return k == 0 ? n - 1 : 0x3f80 + n - 1; },
        absl::StrCat("broadcast, rank ", r));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooGroupTest, Values(1, 2, 3, 4),
                         ::gradsync::testing::WorldName);

// ---------------------------------------------------------------------------
// Bad arguments (the options every backend checks: backend_conformance_test).

TEST(GlooBackendArgumentsTest, CreateRejectsBadOptions) {
  InMemoryStore store;
  struct Case {
    const char* what;
    BackendOptions options;
    Store* store;
    GlooOptions gloo;
    const char* message;
  };
  GlooOptions foreign_address;
  foreign_address.hostname = "192.0.2.1";  // TEST-NET-1: not this machine's
  GlooOptions unresolvable;
  // Not a host name (a space), so the resolver refuses it without a query.
  unresolvable.hostname = "gradsync no such host.invalid";
  GlooOptions no_such_interface;
  no_such_interface.network_interface = "gradsync-no-such-if";
  const Case cases[] = {
      {"no store", OptionsFor(0, 1, kBound), nullptr, {}, "no store"},
      {"foreign address", OptionsFor(0, 1, kBound), &store, foreign_address,
       "cannot listen on host '192.0.2.1'"},
      {"unresolvable name", OptionsFor(0, 1, kBound), &store, unresolvable,
       "cannot listen on host 'gradsync no such host.invalid': the name does "
       "not resolve"},
      {"no such interface", OptionsFor(0, 1, kBound), &store, no_such_interface,
       "cannot listen on interface 'gradsync-no-such-if'"},
  };
  for (const Case& c : cases) {
    auto backend = GlooBackend::Create(c.options, c.store, c.gloo);
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what << ": " << backend.status();
    EXPECT_THAT(std::string(backend.status().message()), HasSubstr(c.message))
        << c.what;
  }
}

// ---------------------------------------------------------------------------
// Failures: a missing peer, a peer that never issues a collective, a peer
// that dies, a backend destroyed with collectives queued.

TEST(GlooBackendFailureTest, BootstrapFailsWhenAPeerNeverArrives) {
  InMemoryStore store;
  const absl::Time start = absl::Now();
  auto backend =
      GlooBackend::Create(OptionsFor(0, 2, absl::Milliseconds(300)), &store);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kDeadlineExceeded)
      << backend.status();
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr("gloo bootstrap (rank 0 of 2)"));
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("missing: 1"));
  EXPECT_LT(took, kBound);
}

TEST(GlooBackendFailureTest, CollectiveAPeerNeverIssuesFailsAtTheTimeout) {
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

  // The backend's timeout fails the collective itself.
  absl::Status status = work->Wait(kBound);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("gloo allreduce #1 (rank 0 of 2): "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("Timed out"));
  EXPECT_GE(took, kTimeout - absl::Milliseconds(50));
  EXPECT_LT(took, kBound);

  // The connections are gone now: later collectives fail at once, on both
  // ranks.
  auto after = backends[0]->Barrier();
  absl::Status after_status = after->Wait(kBound);
  EXPECT_EQ(after_status.code(), absl::StatusCode::kAborted) << after_status;
  EXPECT_THAT(std::string(after_status.message()),
              HasSubstr("gloo barrier #2 (rank 0 of 2): not run"));
  EXPECT_THAT(std::string(after_status.message()),
              HasSubstr("create a new backend"));

  auto peer = backends[1]->AllReduce(BufferOf(data), ReduceOp::kSum);
  absl::Status peer_status = peer->Wait(kBound);
  EXPECT_EQ(peer_status.code(), absl::StatusCode::kUnavailable) << peer_status;
  EXPECT_THAT(std::string(peer_status.message()),
              HasSubstr("gloo allreduce #1 (rank 1 of 2): "));
}

class GlooPeerDeathTest : public ::testing::TestWithParam<int> {};

// Rank 1's backend is destroyed (its sockets close) while the other ranks
// are in an allreduce: they fail with UNAVAILABLE well before their timeout.
TEST_P(GlooPeerDeathTest, OthersFailPromptlyWhenARankDies) {
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
                HasSubstr("gloo allreduce #1 (rank "));
  }
  EXPECT_LT(absl::Now() - start, kBound);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooPeerDeathTest, Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

TEST(GlooBackendFailureTest, DestroyingCancelsCollectivesNotStarted) {
  constexpr absl::Duration kTimeout = absl::Seconds(1);
  InMemoryStore store;
  auto backends = StartGroup(2, &store, kTimeout);
  ASSERT_EQ(backends.size(), 2u);
  std::vector<float> data(10, 1.0f);
  // Rank 1 issues none of these: the first blocks until the timeout, and the
  // destructor runs long before it ends.
  auto first = backends[0]->AllReduce(BufferOf(data), ReduceOp::kSum);
  auto second = backends[0]->Broadcast(BufferOf(data), 0);
  auto third = backends[0]->Barrier();
  const absl::Time start = absl::Now();
  backends[0].reset();
  EXPECT_LT(absl::Now() - start, kTimeout + kBound);

  // The first was either running (and timed out) or not started yet.
  EXPECT_THAT(first->status().code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                            absl::StatusCode::kCancelled))
      << first->status();
  for (const auto& work : {second, third}) {
    EXPECT_EQ(work->status().code(), absl::StatusCode::kCancelled)
        << work->status();
    EXPECT_THAT(std::string(work->status().message()),
                HasSubstr("the backend was destroyed before it ran"));
  }
  EXPECT_THAT(std::string(third->status().message()),
              HasSubstr("gloo barrier #3 (rank 0 of 2)"));
}

// ---------------------------------------------------------------------------
// Bootstrapping through a real coordinator's key-value store.

TEST(GlooBackendCoordinatorTest, RanksBootstrapThroughTheCoordinator) {
  CoordinatorConfig config;
  config.listen_address = "127.0.0.1:0";
  config.poll_interval = absl::Milliseconds(5);
  Coordinator coordinator(config);
  ASSERT_TRUE(coordinator.Start().ok());
  const std::string target = absl::StrCat("127.0.0.1:", coordinator.port());

  constexpr int kWorld = 2;
  v1::JobConfig job;
  job.set_job_id("gloo-bootstrap");
  job.set_min_nodes(kWorld);
  job.set_max_nodes(kWorld);
  *job.mutable_join_timeout() = ToProtoDuration(absl::Seconds(30));
  *job.mutable_last_call_timeout() = ToProtoDuration(absl::ZeroDuration());

  std::vector<std::vector<float>> data(kWorld);
  std::vector<absl::Status> results(kWorld, absl::UnknownError("not run"));
  std::vector<v1::Assignment> assignments(kWorld);
  OnEveryRank(kWorld, [&](int thread) {
    ClientOptions options;
    options.target = target;
    auto client = GrpcCoordinatorClient::Create(options);
    if (!client.ok()) {
      results[thread] = client.status();
      return;
    }
    v1::JoinRequest join;
    join.set_job_id(job.job_id());
    *join.mutable_config() = job;
    *join.mutable_node() = LocalNodeDescriptor();
    join.mutable_node()->set_node_id(absl::StrCat("node-", thread));
    join.mutable_node()->add_addresses("127.0.0.1");
    auto assignment = (*client)->Join(join);
    if (!assignment.ok()) {
      results[thread] = assignment.status();
      return;
    }
    assignments[thread] = *assignment;
    v1::Scope scope;
    scope.set_job_id(assignment->job_id());
    scope.set_round(assignment->round());
    CoordinatorStore store(client->get(), scope, "gloo/");
    auto backend = GlooBackend::Create(
        OptionsFor(assignment->rank(), assignment->world_size(), kBound),
        &store);
    if (!backend.ok()) {
      results[thread] = backend.status();
      return;
    }
    data[thread].assign(1000, static_cast<float>(assignment->rank() + 1));
    results[thread] = (*backend)
                          ->AllReduce(BufferOf(data[thread]), ReduceOp::kSum)
                          ->Wait(kBound);
  });

  for (int t = 0; t < kWorld; ++t) {
    EXPECT_TRUE(results[t].ok()) << "thread " << t << ": " << results[t];
    EXPECT_EQ(assignments[t].backend(), v1::BACKEND_GLOO);
    ExpectElements(
        data[t], [](size_t) { return 3.0f; }, absl::StrCat("thread ", t));
  }
  EXPECT_NE(assignments[0].rank(), assignments[1].rank());
  coordinator.Shutdown();
}

}  // namespace
}  // namespace gradsync
