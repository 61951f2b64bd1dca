#include "server/rendezvous_manager.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "server/job_manager.h"
#include "server/join_request.h"
#include "server/kv_manager.h"
#include "server/round_lifecycle.h"
#include "server/round_placement.h"
#include "server/storage/in_memory_storage.h"
#include "tests/testing/controlled_storage.h"
#include "tests/testing/outcome.h"

namespace gradsync {
namespace {

using ::gradsync::testing::ControlledStorage;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kJob[] = "train";

// The outcome of one Join.
class JoinOutcome : public Outcome<absl::StatusOr<v1::Assignment>> {
 public:
  absl::Status status() const { return result().status(); }
  // The assignment; an empty one (and a test failure) when there is none.
  v1::Assignment assignment() const {
    absl::StatusOr<v1::Assignment> r = result();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::Assignment();
  }
};

enum class Device { kCpu, kCudaNccl, kCudaNoNccl };

v1::NodeDescriptor Node(const std::string& host, const std::string& incarnation,
                        Device device = Device::kCpu) {
  v1::NodeDescriptor node;
  node.set_hostname(host);  // node_id defaults to the hostname
  node.set_incarnation_id(incarnation);
  node.add_addresses("10.0.0.1");
  node.set_pid(1234);
  switch (device) {
    case Device::kCpu:
      node.set_device_type(v1::DEVICE_TYPE_CPU);
      break;
    case Device::kCudaNccl:
      node.set_device_type(v1::DEVICE_TYPE_CUDA);
      node.set_device_count(8);
      node.set_nccl_available(true);
      break;
    case Device::kCudaNoNccl:
      node.set_device_type(v1::DEVICE_TYPE_CUDA);
      node.set_device_count(8);
      node.set_nccl_available(false);
      break;
  }
  return node;
}

// Fluent description of a job config; unset fields keep their defaults.
struct ConfigSpec {
  ConfigSpec& Min(int n) {
    min_nodes = n;
    return *this;
  }
  ConfigSpec& Max(int n) {
    max_nodes = n;
    return *this;
  }
  ConfigSpec& Nproc(int n) {
    nproc_per_node = n;
    return *this;
  }
  ConfigSpec& JoinTimeout(absl::Duration d) {
    join_timeout = d;
    return *this;
  }
  ConfigSpec& LastCall(absl::Duration d) {
    last_call_timeout = d;
    return *this;
  }
  ConfigSpec& Backend(v1::Backend b) {
    backend = b;
    return *this;
  }

  int min_nodes = 1;
  int max_nodes = 0;
  int nproc_per_node = 1;
  std::optional<absl::Duration> join_timeout;
  std::optional<absl::Duration> last_call_timeout;
  v1::Backend backend = v1::BACKEND_UNSPECIFIED;
};

v1::JobConfig Config(const ConfigSpec& spec) {
  v1::JobConfig config;
  config.set_job_id(kJob);
  config.set_min_nodes(spec.min_nodes);
  config.set_max_nodes(spec.max_nodes);
  config.set_nproc_per_node(spec.nproc_per_node);
  if (spec.join_timeout.has_value()) {
    *config.mutable_join_timeout() = ToProtoDuration(*spec.join_timeout);
  }
  if (spec.last_call_timeout.has_value()) {
    *config.mutable_last_call_timeout() =
        ToProtoDuration(*spec.last_call_timeout);
  }
  config.set_backend(spec.backend);
  return config;
}

// Records the round events it is told about (the kind, job and round).
class EventLog : public RoundListener {
 public:
  using Entry = std::tuple<std::string, int64_t, RoundEvent::Kind>;
  void OnRoundEvent(const RoundEvent& event) override {
    absl::MutexLock lock(&mu_);
    entries_.emplace_back(event.job_id, event.round, event.kind);
    reasons_.push_back(event.reason);
  }
  std::vector<Entry> entries() const {
    absl::MutexLock lock(&mu_);
    return entries_;
  }
  // The entries of `kind` only.
  std::vector<Entry> Only(RoundEvent::Kind kind) const {
    std::vector<Entry> out;
    for (const Entry& e : entries()) {
      if (std::get<2>(e) == kind) out.push_back(e);
    }
    return out;
  }
  std::vector<std::string> reasons() const {
    absl::MutexLock lock(&mu_);
    return reasons_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> reasons_ ABSL_GUARDED_BY(mu_);
};

class RendezvousManagerTest : public ::testing::Test {
 protected:
  // Sets the config the helpers join with.
  void UseConfig(const ConfigSpec& spec) { config_ = Config(spec); }

  v1::JoinRequest Request(const v1::NodeDescriptor& node,
                          int64_t last_round = 0) const {
    v1::JoinRequest request;
    request.set_job_id(kJob);
    *request.mutable_config() = config_;
    *request.mutable_node() = node;
    request.set_last_round(last_round);
    return request;
  }

  uint64_t Join(const v1::NodeDescriptor& node, JoinOutcome* outcome,
                int64_t last_round = 0) {
    return rdzv_.Join(Request(node, last_round), outcome->Callback());
  }

  // A survivor rejoining after `last_round` with `committed_step` steps of
  // training state.
  void Rejoin(const v1::NodeDescriptor& node, JoinOutcome* outcome,
              int64_t last_round, int64_t committed_step) {
    v1::JoinRequest request = Request(node, last_round);
    request.set_has_state(true);
    request.set_committed_step(committed_step);
    rdzv_.Join(request, outcome->Callback());
  }

  // Steps the clock and runs the periodic work, as the server's poller does.
  void AdvanceAndPoll(absl::Duration d) {
    clock_.Advance(d);
    rdzv_.Poll();
    kv_.Poll();
  }

  v1::JobStatus Status() const {
    absl::StatusOr<v1::JobStatus> status = jobs_.Get(kJob);
    EXPECT_TRUE(status.ok()) << status.status();
    v1::JobStatus out = status.ok() ? *status : v1::JobStatus();
    rdzv_.DescribeWaiting(kJob, &out);
    return out;
  }

  absl::Status KvSet(int64_t round) {
    return kv_.Set({kJob, round}, "probe", "x");
  }

  InMemoryStorage storage_;
  FakeClock clock_;
  JobManager jobs_{&storage_, &clock_};
  KvManager kv_{&storage_, &clock_, &jobs_};
  // Round events the manager reported, in order.
  EventLog events_;
  RendezvousManager rdzv_{&jobs_, &clock_, {&kv_, &events_}};
  v1::JobConfig config_ = Config(ConfigSpec());
};

// ---------------------------------------------------------------------------
// Closing a round

TEST_F(RendezvousManagerTest, RoundClosesAsSoonAsMaxNodesJoin) {
  UseConfig(ConfigSpec().Min(3).Max(3));
  JoinOutcome a, b, c;
  EXPECT_NE(Join(Node("host-a", "inc-a"), &a), 0u);
  EXPECT_NE(Join(Node("host-b", "inc-b"), &b), 0u);
  EXPECT_FALSE(a.done());
  EXPECT_FALSE(b.done());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING);
  Join(Node("host-c", "inc-c"), &c);
  ASSERT_TRUE(a.done());
  ASSERT_TRUE(b.done());
  ASSERT_TRUE(c.done());

  // Ranks in join order, contiguous from 0.
  const JoinOutcome* outcomes[] = {&a, &b, &c};
  for (int i = 0; i < 3; ++i) {
    v1::Assignment assignment = outcomes[i]->assignment();
    EXPECT_EQ(assignment.job_id(), kJob);
    EXPECT_EQ(assignment.round(), 1);
    EXPECT_EQ(assignment.rank(), i);
    EXPECT_EQ(assignment.local_rank(), 0);
    EXPECT_EQ(assignment.world_size(), 3);
    EXPECT_EQ(assignment.local_world_size(), 1);
    EXPECT_EQ(assignment.node_rank(), i);
    EXPECT_EQ(assignment.num_nodes(), 3);
    EXPECT_EQ(assignment.backend(), v1::BACKEND_GLOO);  // CPU nodes
    EXPECT_EQ(assignment.kv_prefix(), "kv/train/1/");
    EXPECT_EQ(outcomes[i]->calls(), 1);
  }
}

TEST_F(RendezvousManagerTest, ClosedRoundIsRecordedInTheJobAndOpensItsKvRound) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  EXPECT_EQ(KvSet(1).code(), absl::StatusCode::kNotFound);  // no job yet
  Join(Node("host-a", "inc-a"), &a);
  // The first join created the job; no round has closed.
  EXPECT_EQ(KvSet(1).code(), absl::StatusCode::kFailedPrecondition);
  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(b.done());

  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.round(), 1);
  EXPECT_EQ(status.world_size(), 2);
  EXPECT_EQ(status.backend(), v1::BACKEND_GLOO);
  ASSERT_EQ(status.members_size(), 2);
  EXPECT_EQ(status.members(0).rank(), 0);
  EXPECT_EQ(status.members(0).node().incarnation_id(), "inc-a");
  EXPECT_EQ(status.members(0).node().node_id(), "host-a");  // from hostname
  EXPECT_EQ(status.members(0).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(status.members(1).rank(), 1);
  EXPECT_EQ(status.members(1).node().incarnation_id(), "inc-b");
  EXPECT_EQ(FromProtoTime(status.round_close_time()), clock_.Now());
  EXPECT_THAT(status.waiting(), IsEmpty());
  EXPECT_THAT(status.spares(), IsEmpty());
  EXPECT_TRUE(KvSet(1).ok());
}

TEST_F(RendezvousManagerTest, ProcessesAreGroupedIntoNodesByHostname) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(2));
  JoinOutcome a0, b0, b1, a1;
  // Interleaved: node order is that of each node's first process.
  Join(Node("host-a", "a0"), &a0);
  Join(Node("host-b", "b0"), &b0);
  Join(Node("host-b", "b1"), &b1);
  EXPECT_FALSE(b1.done());  // host-a is not complete yet
  Join(Node("host-a", "a1"), &a1);
  ASSERT_TRUE(a0.done() && a1.done() && b0.done() && b1.done());

  struct Expected {
    const JoinOutcome* outcome;
    int rank, local_rank, node_rank;
  };
  for (const Expected& e : {Expected{&a0, 0, 0, 0}, Expected{&a1, 1, 1, 0},
                            Expected{&b0, 2, 0, 1}, Expected{&b1, 3, 1, 1}}) {
    v1::Assignment assignment = e.outcome->assignment();
    EXPECT_EQ(assignment.rank(), e.rank);
    EXPECT_EQ(assignment.local_rank(), e.local_rank);
    EXPECT_EQ(assignment.node_rank(), e.node_rank);
    EXPECT_EQ(assignment.rank(),
              assignment.node_rank() * 2 + assignment.local_rank());
    EXPECT_EQ(assignment.world_size(), 4);
    EXPECT_EQ(assignment.local_world_size(), 2);
    EXPECT_EQ(assignment.num_nodes(), 2);
  }
  v1::JobStatus status = Status();
  ASSERT_EQ(status.members_size(), 4);
  EXPECT_EQ(status.members(1).node().incarnation_id(), "a1");
  EXPECT_EQ(status.members(1).local_rank(), 1);
  EXPECT_EQ(status.members(2).node().incarnation_id(), "b0");
  EXPECT_EQ(status.members(2).node_rank(), 1);
}

TEST_F(RendezvousManagerTest, ExplicitNodeIdOverridesTheHostname) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(2));
  // Four processes on one host, split into two nodes by node_id.
  JoinOutcome o[4];
  for (int i = 0; i < 4; ++i) {
    v1::NodeDescriptor node = Node("shared-host", absl::StrCat("p", i));
    node.set_node_id(i < 2 ? "slot-0" : "slot-1");
    Join(node, &o[i]);
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(o[i].done()) << i;
    EXPECT_EQ(o[i].assignment().rank(), i);
    EXPECT_EQ(o[i].assignment().node_rank(), i / 2);
  }
}

TEST_F(RendezvousManagerTest, NodeIdAloneIsEnoughWithoutAHostname) {
  UseConfig(ConfigSpec().Min(1).Max(1));
  v1::NodeDescriptor node = Node("", "inc-a");
  node.set_node_id("rack1-slot3");
  JoinOutcome a;
  Join(node, &a);
  ASSERT_TRUE(a.done());
  EXPECT_TRUE(a.status().ok()) << a.status();
  EXPECT_EQ(Status().members(0).node().node_id(), "rack1-slot3");
}

TEST_F(RendezvousManagerTest, IncompleteNodesDoNotCountTowardMinNodes) {
  UseConfig(ConfigSpec().Min(1).Max(2).Nproc(2).LastCall(absl::ZeroDuration()));
  JoinOutcome a0, b0, a1;
  Join(Node("host-a", "a0"), &a0);
  Join(Node("host-b", "b0"), &b0);
  AdvanceAndPoll(absl::Minutes(1));
  EXPECT_FALSE(a0.done());
  EXPECT_FALSE(b0.done());
  Join(Node("host-a", "a1"), &a1);
  // host-a is complete: min reached with a zero last call.
  ASSERT_TRUE(a0.done());
  ASSERT_TRUE(a1.done());
  EXPECT_EQ(a0.assignment().world_size(), 2);
  EXPECT_EQ(a0.assignment().num_nodes(), 1);
  // The incomplete node waits as a spare of the running round.
  EXPECT_FALSE(b0.done());
  v1::JobStatus status = Status();
  ASSERT_EQ(status.spares_size(), 1);
  EXPECT_EQ(status.spares(0).node().incarnation_id(), "b0");
}

// ---------------------------------------------------------------------------
// min:max and the last call

TEST_F(RendezvousManagerTest, RoundClosesWithMinNodesOnlyAfterTheLastCall) {
  UseConfig(ConfigSpec().Min(2).Max(4).LastCall(absl::Seconds(30)));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  EXPECT_FALSE(a.done());
  EXPECT_FALSE(b.done());

  AdvanceAndPoll(absl::Seconds(30) - absl::Milliseconds(1));
  EXPECT_FALSE(a.done());
  EXPECT_FALSE(b.done());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING);

  clock_.Advance(absl::Milliseconds(1));
  EXPECT_FALSE(a.done());  // only Poll closes on time
  rdzv_.Poll();
  ASSERT_TRUE(a.done());
  ASSERT_TRUE(b.done());
  EXPECT_EQ(a.assignment().world_size(), 2);
  EXPECT_EQ(a.assignment().num_nodes(), 2);
  EXPECT_EQ(a.assignment().rank(), 0);
  EXPECT_EQ(b.assignment().rank(), 1);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(RendezvousManagerTest, DefaultLastCallIsThirtySeconds) {
  UseConfig(ConfigSpec().Min(1).Max(2));
  JoinOutcome a;
  Join(Node("host-a", "inc-a"), &a);
  AdvanceAndPoll(absl::Seconds(29));
  EXPECT_FALSE(a.done());
  AdvanceAndPoll(absl::Seconds(1));
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.assignment().world_size(), 1);
}

TEST_F(RendezvousManagerTest, NodesJoiningDuringTheLastCallAreIncluded) {
  UseConfig(ConfigSpec().Min(2).Max(4).LastCall(absl::Seconds(30)));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  AdvanceAndPoll(absl::Seconds(20));
  Join(Node("host-c", "inc-c"), &c);
  EXPECT_FALSE(c.done());
  // The last call runs from when min nodes first completed, not restarted.
  AdvanceAndPoll(absl::Seconds(10));
  ASSERT_TRUE(a.done() && b.done() && c.done());
  EXPECT_EQ(c.assignment().world_size(), 3);
  EXPECT_EQ(c.assignment().rank(), 2);
}

TEST_F(RendezvousManagerTest, ReachingMaxDuringTheLastCallClosesAtOnce) {
  UseConfig(ConfigSpec().Min(1).Max(3).LastCall(absl::Seconds(30)));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  EXPECT_FALSE(a.done());
  Join(Node("host-c", "inc-c"), &c);
  ASSERT_TRUE(a.done() && b.done() && c.done());
  EXPECT_EQ(a.assignment().world_size(), 3);
  // The cancelled last call does nothing later.
  AdvanceAndPoll(absl::Minutes(1));
  EXPECT_EQ(Status().round(), 1);
  EXPECT_EQ(a.calls(), 1);
}

TEST_F(RendezvousManagerTest, ZeroLastCallClosesAtMinNodesImmediately) {
  UseConfig(ConfigSpec().Min(2).Max(4).LastCall(absl::ZeroDuration()));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  EXPECT_FALSE(a.done());
  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(a.done());
  ASSERT_TRUE(b.done());
  EXPECT_EQ(a.assignment().world_size(), 2);
  EXPECT_EQ(b.assignment().rank(), 1);
  // A later joiner asks the round (2 of at most 4 nodes) to re-form at a
  // step boundary to admit it; the round runs on meanwhile.
  Join(Node("host-c", "inc-c"), &c);
  EXPECT_FALSE(c.done());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(RendezvousManagerTest, ReformingRoundWaitsForItsOldNodesAGraceAtLeast) {
  UseConfig(ConfigSpec().Min(1).Max(3).LastCall(absl::ZeroDuration()));
  JoinOutcome a, b, a2;
  Join(Node("host-a", "inc-a"), &a);
  ASSERT_TRUE(a.done());
  Join(Node("host-b", "inc-b"), &b);  // grows: round 1 re-forms
  Rejoin(Node("host-a", "inc-a"), &a2, 1, 3);
  ASSERT_TRUE(a2.done() && b.done()) << "every old node is back";
  // Round 2 has 2 nodes; a's process hangs (never rejoins, never found
  // lost) when b rejoins alone: the round waits the grace, then closes.
  JoinOutcome b2;
  Rejoin(Node("host-b", "inc-b"), &b2, 2, 5);
  AdvanceAndPoll(RendezvousManager::kAwaitedGrace - absl::Milliseconds(1));
  EXPECT_FALSE(b2.done());
  AdvanceAndPoll(absl::Milliseconds(1));
  ASSERT_TRUE(b2.done());
  EXPECT_EQ(b2.assignment().round(), 3);
  EXPECT_EQ(b2.assignment().world_size(), 1);
}

// ---------------------------------------------------------------------------
// Join timeout

TEST_F(RendezvousManagerTest,
       JoinBelowMinFailsWithDeadlineExceededAfterTimeout) {
  UseConfig(ConfigSpec().Min(3).Max(3).JoinTimeout(absl::Seconds(60)));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  AdvanceAndPoll(absl::Seconds(30));
  Join(Node("host-b", "inc-b"), &b);

  AdvanceAndPoll(absl::Seconds(30) - absl::Milliseconds(1));
  EXPECT_FALSE(a.done());
  AdvanceAndPoll(absl::Milliseconds(1));
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(a.status().message(),
              HasSubstr("job 'train' needs at least 3 node(s)"));
  EXPECT_THAT(a.status().message(),
              HasSubstr("only 2 complete node(s) joined"));

  // The other joiner keeps waiting; the job is still forming.
  EXPECT_FALSE(b.done());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(status.round(), 0);
  ASSERT_EQ(status.waiting_size(), 1);
  EXPECT_EQ(status.waiting(0).node().incarnation_id(), "inc-b");

  AdvanceAndPoll(absl::Seconds(30));
  ASSERT_TRUE(b.done());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(b.status().message(),
              HasSubstr("only 1 complete node(s) joined"));
  EXPECT_EQ(a.calls(), 1);
  EXPECT_THAT(Status().waiting(), IsEmpty());
}

TEST_F(RendezvousManagerTest, TimedOutJoinerNoLongerCountsTowardTheRound) {
  UseConfig(ConfigSpec().Min(2).Max(2).JoinTimeout(absl::Seconds(60)));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  AdvanceAndPoll(absl::Seconds(60));
  ASSERT_TRUE(a.done());
  Join(Node("host-b", "inc-b"), &b);
  EXPECT_FALSE(b.done());  // a is gone: one node only
  Join(Node("host-c", "inc-c"), &c);
  ASSERT_TRUE(b.done() && c.done());
  EXPECT_EQ(b.assignment().rank(), 0);
  EXPECT_EQ(c.assignment().rank(), 1);
}

TEST_F(RendezvousManagerTest, TimedOutJoinBelowMinCancelsTheLastCall) {
  UseConfig(ConfigSpec()
                .Min(2)
                .Max(3)
                .JoinTimeout(absl::Seconds(60))
                .LastCall(absl::Seconds(50)));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  AdvanceAndPoll(absl::Seconds(20));
  Join(Node("host-b", "inc-b"), &b);  // last call until t=70s
  AdvanceAndPoll(absl::Seconds(40));  // t=60s: a times out
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded);
  AdvanceAndPoll(absl::Seconds(10));  // t=70s: no round with one node
  EXPECT_FALSE(b.done());
  EXPECT_EQ(Status().round(), 0);
}

// ---------------------------------------------------------------------------
// Waiting processes and spares

TEST_F(RendezvousManagerTest,
       WaitingProcessesShowInStatusBeforeTheRoundCloses) {
  UseConfig(ConfigSpec().Min(3).Max(3));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  AdvanceAndPoll(absl::Seconds(1));
  Join(Node("host-b", "inc-b"), &b);
  v1::JobStatus status = Status();
  EXPECT_THAT(status.members(), IsEmpty());
  EXPECT_THAT(status.spares(), IsEmpty());
  ASSERT_EQ(status.waiting_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const v1::Member& m = status.waiting(i);
    EXPECT_EQ(m.rank(), -1);
    EXPECT_EQ(m.local_rank(), -1);
    EXPECT_EQ(m.node_rank(), -1);
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_WAITING);
  }
  // In join order, with their join time.
  EXPECT_EQ(status.waiting(0).node().incarnation_id(), "inc-a");
  EXPECT_EQ(status.waiting(1).node().incarnation_id(), "inc-b");
  EXPECT_EQ(FromProtoTime(status.waiting(1).last_seen()), clock_.Now());
  EXPECT_EQ(FromProtoTime(status.waiting(0).last_seen()),
            clock_.Now() - absl::Seconds(1));
}

TEST_F(RendezvousManagerTest, JoinersBeyondMaxWaitAsSpares) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b, c, d;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(a.done() && b.done());
  EXPECT_NE(Join(Node("host-c", "inc-c"), &c), 0u);
  Join(Node("host-d", "inc-d"), &d);
  EXPECT_FALSE(c.done());
  EXPECT_FALSE(d.done());

  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.members_size(), 2);
  EXPECT_THAT(status.waiting(), IsEmpty());
  ASSERT_EQ(status.spares_size(), 2);
  EXPECT_EQ(status.spares(0).node().incarnation_id(), "inc-c");
  EXPECT_EQ(status.spares(1).node().incarnation_id(), "inc-d");
  for (const v1::Member& spare : status.spares()) {
    EXPECT_EQ(spare.rank(), -1);
    EXPECT_EQ(spare.state(), v1::MEMBER_STATE_SPARE);
  }
  // Spares do not disturb the running round.
  EXPECT_TRUE(KvSet(1).ok());
  EXPECT_EQ(a.calls(), 1);
}

TEST_F(RendezvousManagerTest, SpareTimesOutWithAMessageSayingItWasASpare) {
  UseConfig(ConfigSpec().Min(1).Max(1).JoinTimeout(absl::Seconds(60)));
  JoinOutcome a, spare;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &spare);
  AdvanceAndPoll(absl::Seconds(60));
  ASSERT_TRUE(spare.done());
  EXPECT_EQ(spare.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(spare.status().message(),
              HasSubstr("job 'train' is running round 1"));
  EXPECT_THAT(spare.status().message(), HasSubstr("as a spare"));
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(RendezvousManagerTest, ReturningNodesTakePlacesBeforeSpares) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b, c, d, a2;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  Join(Node("host-d", "inc-d"), &d);
  // a rejoins: round 1 is superseded. b, which holds state too, is awaited
  // although the spares alone could fill the round.
  Join(Node("host-a", "inc-a"), &a2, /*last_round=*/1);
  EXPECT_FALSE(a2.done());
  // b is lost: a, a node of round 1, takes a place first and the
  // longest-waiting spare (c) takes the other; d stays spare.
  rdzv_.MemberLost(kJob, 1, /*rank=*/1, "rank 1 (host-b) lost");
  ASSERT_TRUE(a2.done() && c.done());
  EXPECT_EQ(a2.assignment().round(), 2);
  EXPECT_EQ(c.assignment().round(), 2);
  EXPECT_EQ(a2.assignment().node_rank(), 0) << "a keeps its old node rank";
  EXPECT_FALSE(d.done());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.round(), 2);
  ASSERT_EQ(status.spares_size(), 1);
  EXPECT_EQ(status.spares(0).node().incarnation_id(), "inc-d");
}

// A killed member's stream breaks into its reconnect grace, the survivors'
// collective fails and one of them rejoins first: the loss reported next
// (health reports members in their grace when the round is superseded) is
// the recovery's cause, not the rejoin.
TEST_F(RendezvousManagerTest, ALossAfterASurvivorsRejoinBecomesTheCause) {
  UseConfig(ConfigSpec().Min(2).Max(3));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  AdvanceAndPoll(absl::Seconds(60));
  ASSERT_TRUE(a.done() && b.done() && c.done());
  ASSERT_EQ(b.assignment().rank(), 1);

  JoinOutcome a2, c2;
  Rejoin(Node("host-a", "inc-a"), &a2, 1, /*committed_step=*/5);
  EXPECT_THAT(Status().reason(), HasSubstr("rejoined after round 1"));
  rdzv_.MemberLost(kJob, 1, /*rank=*/1,
                   "rank 1 (host-b) lost: heartbeat stream broke");
  Rejoin(Node("host-c", "inc-c"), &c2, 1, /*committed_step=*/5);
  ASSERT_TRUE(a2.done() && c2.done()) << "b is not waited for";
  v1::JobStatus status = Status();
  ASSERT_EQ(status.recoveries_size(), 1);
  EXPECT_EQ(status.recoveries(0).cause(),
            "rank 1 (host-b) lost: heartbeat stream broke");
  EXPECT_EQ(status.recoveries(0).new_world_size(), 2);
  EXPECT_TRUE(status.recoveries(0).resumed_in_place());
  EXPECT_EQ(status.recoveries(0).resume_step(), 5);
}

// A heal after a divergence: every member rejoins, and the state comes from
// a member of the majority even when the diverged one is further ahead;
// when none of the majority comes back with state, from the diverged one.
TEST_F(RendezvousManagerTest, AHealTakesTheStateFromTheMajority) {
  UseConfig(ConfigSpec().Min(3).Max(3));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  ASSERT_TRUE(c.done());
  const std::string why = "replicas diverged at step 50: rank(s) 2 differ";
  rdzv_.HealDivergence(kJob, 0, {2}, "stale round: ignored");
  rdzv_.HealDivergence(kJob, 1, {2}, why);
  JoinOutcome a2, b2, c2;
  Rejoin(Node("host-c", "inc-c"), &c2, 1, /*committed_step=*/61);
  Rejoin(Node("host-a", "inc-a"), &a2, 1, /*committed_step=*/60);
  Rejoin(Node("host-b", "inc-b"), &b2, 1, /*committed_step=*/60);
  ASSERT_TRUE(a2.done() && b2.done() && c2.done());
  for (const JoinOutcome* o : {&a2, &b2, &c2}) {
    EXPECT_EQ(o->assignment().round(), 2);
    EXPECT_EQ(o->assignment().resume_step(), 60);
    EXPECT_NE(o->assignment().source_rank(), c2.assignment().rank());
  }
  v1::JobStatus status = Status();
  ASSERT_EQ(status.recoveries_size(), 1);
  EXPECT_EQ(status.recoveries(0).cause(), why);

  // Round 2's diverged rank is a's; only it comes back with state.
  rdzv_.HealDivergence(kJob, 2, {a2.assignment().rank()}, why);
  JoinOutcome a3, b3, c3;
  Rejoin(Node("host-a", "inc-a"), &a3, 2, /*committed_step=*/90);
  Join(Node("host-b", "inc-b"), &b3, /*last_round=*/2);  // no state
  Join(Node("host-c", "inc-c"), &c3, /*last_round=*/2);
  ASSERT_TRUE(a3.done() && b3.done() && c3.done());
  EXPECT_EQ(a3.assignment().resume_step(), 90);
  EXPECT_EQ(a3.assignment().source_rank(), a3.assignment().rank());
}

// A rebalance asks the running round to re-form at a step boundary; the
// next round, of the same processes in the same places, gives each rank
// its share (by place, so whoever gets which rank), and so do later rounds
// of the same members; a round with other members divides evenly again.
TEST_F(RendezvousManagerTest, ARebalanceReformsTheRoundWithItsShares) {
  UseConfig(ConfigSpec().Min(2).Max(3));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  ASSERT_TRUE(a.done() && b.done() && c.done());
  EXPECT_TRUE(a.assignment().may_rebalance());
  EXPECT_THAT(a.assignment().micro_batch_shares(), IsEmpty());
  // Stale rounds, and shares that do not fit the round, change nothing.
  rdzv_.Rebalance(kJob, 0, {11, 10, 3}, "stale");
  rdzv_.Rebalance(kJob, 1, {12, 12}, "two shares for three ranks");
  EXPECT_THAT(events_.Only(RoundEvent::Kind::kReformRequested), IsEmpty());
  std::vector<int> shares(3);
  shares[a.assignment().rank()] = 11;
  shares[b.assignment().rank()] = 10;
  shares[c.assignment().rank()] = 3;
  rdzv_.Rebalance(kJob, 1, shares, "rank 2 is slow");
  ASSERT_EQ(events_.Only(RoundEvent::Kind::kReformRequested).size(), 1u);
  rdzv_.Rebalance(kJob, 1, shares, "asked already: a no-op");
  EXPECT_EQ(events_.Only(RoundEvent::Kind::kReformRequested).size(), 1u);

  JoinOutcome a2, b2, c2;
  Rejoin(Node("host-c", "inc-c"), &c2, 1, 40);
  Rejoin(Node("host-b", "inc-b"), &b2, 1, 40);
  Rejoin(Node("host-a", "inc-a"), &a2, 1, 40);
  ASSERT_TRUE(a2.done() && b2.done() && c2.done());
  const auto share_of = [](const JoinOutcome& o) {
    return o.assignment().micro_batch_shares(o.assignment().rank());
  };
  for (const JoinOutcome* o : {&a2, &b2, &c2}) {
    EXPECT_EQ(o->assignment().round(), 2);
    EXPECT_TRUE(o->assignment().follows_planned_reform());
    ASSERT_EQ(o->assignment().micro_batch_shares_size(), 3);
  }
  EXPECT_EQ(share_of(a2), 11);
  EXPECT_EQ(share_of(b2), 10);
  EXPECT_EQ(share_of(c2), 3);
  EXPECT_THAT(Status().recoveries(0).cause(), HasSubstr("rank 2 is slow"));

  // Host-c is lost: the round re-forms with two, evenly.
  rdzv_.MemberLost(kJob, 2, c2.assignment().rank(), "rank lost");
  JoinOutcome a3, b3;
  Rejoin(Node("host-a", "inc-a"), &a3, 2, 50);
  Rejoin(Node("host-b", "inc-b"), &b3, 2, 50);
  ASSERT_TRUE(a3.done() && b3.done());
  EXPECT_EQ(a3.assignment().world_size(), 2);
  EXPECT_THAT(a3.assignment().micro_batch_shares(), IsEmpty());
}

TEST_F(RendezvousManagerTest, AStragglerPolicyOfReportNeverRebalances) {
  v1::JobConfig config = Config(ConfigSpec().Min(1).Max(1));
  config.set_straggler_policy(v1::STRAGGLER_POLICY_REPORT);
  config_ = config;
  JoinOutcome a;
  Join(Node("host-a", "inc-a"), &a);
  ASSERT_TRUE(a.done());
  EXPECT_FALSE(a.assignment().may_rebalance());
}

TEST_F(RendezvousManagerTest, DescribeWaitingOfUnknownJobIsANoOp) {
  v1::JobStatus status;
  rdzv_.DescribeWaiting("nope", &status);
  EXPECT_THAT(status.waiting(), IsEmpty());
  EXPECT_THAT(status.spares(), IsEmpty());
}

// ---------------------------------------------------------------------------
// Recovery: losses, re-forming, the resume source

TEST_F(RendezvousManagerTest, SpareTakesTheLostPlaceAndTheMostAdvancedIsSource) {
  UseConfig(ConfigSpec().Min(3).Max(3));
  JoinOutcome a, b, c, spare;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  Join(Node("host-d", "inc-d"), &spare);
  ASSERT_TRUE(c.done());
  EXPECT_EQ(c.assignment().resume_step(), 0);
  EXPECT_EQ(c.assignment().failure_policy(), v1::FAILURE_POLICY_RECOVER);
  ASSERT_FALSE(spare.done());

  rdzv_.MemberLost(kJob, 1, /*rank=*/1, "rank 1 (host-b) lost: stream broke",
                   absl::Milliseconds(1500));
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING);
  clock_.Advance(absl::Milliseconds(250));
  EXPECT_THAT(Status().reason(), HasSubstr("rank 1 (host-b) lost"));
  JoinOutcome a2, c2;
  Rejoin(Node("host-a", "inc-a"), &a2, 1, /*committed_step=*/7);
  EXPECT_FALSE(a2.done());
  // c committed one step more than a (a's all-reduce of step 8 failed).
  Rejoin(Node("host-c", "inc-c"), &c2, 1, /*committed_step=*/8);
  ASSERT_TRUE(a2.done() && c2.done() && spare.done());
  for (const JoinOutcome* o : {&a2, &c2, &spare}) {
    EXPECT_EQ(o->assignment().round(), 2);
    EXPECT_EQ(o->assignment().world_size(), 3);
    EXPECT_EQ(o->assignment().resume_step(), 8);
    EXPECT_EQ(o->assignment().source_rank(), 2) << "c keeps rank 2";
  }
  EXPECT_EQ(a2.assignment().rank(), 0);
  EXPECT_EQ(spare.assignment().rank(), 1) << "the spare takes the lost rank";

  // The recovery is on the job's record.
  v1::JobStatus status = Status();
  EXPECT_EQ(status.recovery_count(), 1);
  ASSERT_EQ(status.recoveries_size(), 1);
  const v1::Recovery& r = status.recoveries(0);
  EXPECT_EQ(r.failed_round(), 1);
  EXPECT_EQ(r.new_round(), 2);
  EXPECT_EQ(r.cause(), "rank 1 (host-b) lost: stream broke");
  EXPECT_EQ(r.old_world_size(), 3);
  EXPECT_EQ(r.new_world_size(), 3);
  EXPECT_EQ(r.resume_step(), 8);
  EXPECT_EQ(r.source_rank(), 2);
  EXPECT_EQ(FromProtoDuration(r.detection()), absl::Milliseconds(1500));
  EXPECT_EQ(FromProtoDuration(r.rendezvous()), absl::Milliseconds(250));
  const JobCensus census = jobs_.Census();
  EXPECT_EQ(census.recoveries,
            (std::vector<std::pair<std::string, int64_t>>{{kJob, 1}}));
  EXPECT_EQ(census.recovery_phases.at("rendezvous").count, 1);
  EXPECT_EQ(census.recovery_phases.at("detection").counts[7], 1)
      << "1.5 s falls in the (1, 2.5] bucket";
}

// No assignment leaves for a round that is not recorded: the joins that
// would have formed it are refused UNAVAILABLE (clients retry) and nothing
// else changes: no round, no KV round, no event; once storage works, the
// same processes form round 1.
TEST(RendezvousDurableCloseTest, AnUnrecordedRoundIsNotAnswered) {
  ControlledStorage storage;
  FakeClock clock;
  JobManager jobs(&storage, &clock);
  KvManager kv(&storage, &clock, &jobs);
  EventLog events;
  RendezvousManager rdzv(&jobs, &clock, {&kv, &events});
  auto request = [](const std::string& host) {
    v1::JoinRequest r;
    r.set_job_id(kJob);
    *r.mutable_config() = Config(ConfigSpec().Min(2).Max(2));
    *r.mutable_node() = Node(host, "inc-" + host);
    return r;
  };
  JoinOutcome a, b;
  rdzv.Join(request("host-a"), a.Callback());
  ASSERT_FALSE(a.done());
  storage.SetFailing(true);
  rdzv.Join(request("host-b"), b.Callback());
  ASSERT_TRUE(a.done());
  ASSERT_TRUE(b.done());
  for (const JoinOutcome* o : {&a, &b}) {
    EXPECT_EQ(o->status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(o->status().message(), HasSubstr("could not be recorded"));
    EXPECT_THAT(o->status().message(), HasSubstr("disk gone"));
  }
  absl::StatusOr<v1::JobStatus> job = jobs.Get(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->round(), 0);
  EXPECT_EQ(job->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(kv.Get({kJob, 1}, "k").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(events.entries().empty());
  v1::JobStatus waiting;
  rdzv.DescribeWaiting(kJob, &waiting);
  EXPECT_EQ(waiting.waiting_size(), 0) << "the refused joins left";

  storage.SetFailing(false);
  JoinOutcome a2, b2;
  rdzv.Join(request("host-a"), a2.Callback());
  rdzv.Join(request("host-b"), b2.Callback());
  ASSERT_TRUE(a2.done() && b2.done());
  EXPECT_EQ(a2.assignment().round(), 1);
  EXPECT_EQ(b2.assignment().round(), 1);
  EXPECT_EQ(jobs.Get(kJob)->round(), 1);
  EXPECT_TRUE(kv.Set({kJob, 1}, "k", "v").ok());
}

TEST(RendezvousRoundEndedTest, ASupersededRoundIsReportedAfterTheCall) {
  InMemoryStorage storage;
  FakeClock clock;
  JobManager jobs(&storage, &clock);
  KvManager kv(&storage, &clock, &jobs);
  EventLog events;
  RendezvousManager rdzv(&jobs, &clock, {&kv, &events});
  using Kind = RoundEvent::Kind;
  using Entries = std::vector<EventLog::Entry>;
  v1::JoinRequest request;
  request.set_job_id(kJob);
  *request.mutable_config() = Config(ConfigSpec().Min(1).Max(1));
  *request.mutable_node() = Node("host-a", "inc-a");
  JoinOutcome a;
  rdzv.Join(request, a.Callback());
  ASSERT_TRUE(a.done());
  EXPECT_EQ(events.entries(), (Entries{{kJob, 1, Kind::kClosed}}));
  rdzv.MemberLost(kJob, 1, /*rank=*/0, "rank 0 (host-a) lost");
  EXPECT_EQ(events.entries(), (Entries{{kJob, 1, Kind::kClosed},
                                       {kJob, 1, Kind::kSuperseded}}));
  EXPECT_EQ(events.reasons().back(), "rank 0 (host-a) lost");
}

// The one phase value walks the transitions drawn in round_lifecycle.h,
// and every change the other managers act on is an event.
TEST_F(RendezvousManagerTest, ThePhaseFollowsTheRoundsLife) {
  UseConfig(ConfigSpec().Min(2).Max(3).LastCall(absl::Seconds(30)));
  using Kind = RoundEvent::Kind;
  using Entries = std::vector<EventLog::Entry>;
  EXPECT_EQ(rdzv_.PhaseOf(kJob), std::nullopt);
  JoinOutcome a, b, b_again, c;
  Join(Node("host-a", "inc-a"), &a);
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kForming);
  Join(Node("host-b", "inc-b"), &b);
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kLastCall);
  ASSERT_TRUE(rdzv_.Leave(kJob, "inc-b").ok());
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kForming) << "below min again";
  Join(Node("host-b", "inc-b"), &b_again);
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kLastCall);
  AdvanceAndPoll(absl::Seconds(31));
  ASSERT_TRUE(a.done() && b_again.done());
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kRunning);
  EXPECT_EQ(events_.entries(), (Entries{{kJob, 1, Kind::kClosed}}));

  rdzv_.MemberLost(kJob, 1, /*rank=*/1, "rank 1 (host-b) lost");
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kSuperseded);
  JoinOutcome a2;
  Rejoin(Node("host-a", "inc-a"), &a2, 1, 7);
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kSuperseded) << "1 of min 2";
  Join(Node("host-c", "inc-c"), &c);
  ASSERT_TRUE(a2.done() && c.done()) << "nobody else is awaited";
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kRunning);

  rdzv_.JobEnded(kJob, v1::JOB_STATE_SUCCEEDED, "all done");
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kEnded);
  rdzv_.MemberLost(kJob, 2, /*rank=*/0, "late loss");
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kEnded) << "nothing re-forms";
  // A join admitted as the job ended (the job record still said running
  // here) is refused at once instead of waiting for its timeout.
  JoinOutcome late;
  Join(Node("host-d", "inc-d"), &late);
  ASSERT_TRUE(late.done());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("has ended"));
  rdzv_.ForgetJob(kJob);
  EXPECT_EQ(rdzv_.PhaseOf(kJob), std::nullopt);
  // Told also for a job this manager held nothing of (the others may).
  rdzv_.ForgetJob("other");
  EXPECT_EQ(events_.entries(), (Entries{{kJob, 1, Kind::kClosed},
                                        {kJob, 1, Kind::kSuperseded},
                                        {kJob, 2, Kind::kClosed},
                                        {kJob, 2, Kind::kJobEnded},
                                        {kJob, 2, Kind::kForgotten},
                                        {"other", 0, Kind::kForgotten}}));
  EXPECT_EQ(events_.reasons()[1], "rank 1 (host-b) lost");
  EXPECT_THAT(events_.reasons()[3], HasSubstr("all done"));
}

// The ordering contract: a listener hears of a closed round before any of
// its assignments leaves, so the round's store (registered first) is open
// when a member first uses it.
TEST(RendezvousRoundEventTest, ListenersHearOfAClosedRoundBeforeItsAnswers) {
  InMemoryStorage storage;
  FakeClock clock;
  JobManager jobs(&storage, &clock);
  KvManager kv(&storage, &clock, &jobs);
  JoinOutcome a, b;
  struct Probe : RoundListener {
    KvManager* kv = nullptr;
    const JoinOutcome* outcomes[2] = {nullptr, nullptr};
    int closed = 0;
    void OnRoundEvent(const RoundEvent& event) override {
      if (event.kind != RoundEvent::Kind::kClosed) return;
      ++closed;
      for (const JoinOutcome* o : outcomes) EXPECT_FALSE(o->done());
      EXPECT_TRUE(kv->Set({event.job_id, event.round}, "k", "v").ok());
    }
  } probe;
  probe.kv = &kv;
  probe.outcomes[0] = &a;
  probe.outcomes[1] = &b;
  RendezvousManager rdzv(&jobs, &clock, {&kv, &probe});
  auto request = [](const std::string& host) {
    v1::JoinRequest r;
    r.set_job_id(kJob);
    *r.mutable_config() = Config(ConfigSpec().Min(2).Max(2));
    *r.mutable_node() = Node(host, "inc-" + host);
    return r;
  };
  rdzv.Join(request("host-a"), a.Callback());
  rdzv.Join(request("host-b"), b.Callback());
  ASSERT_TRUE(a.done() && b.done());
  EXPECT_EQ(probe.closed, 1);
}

// Rounds closed and superseded by calls on different threads reach the
// listener in the order they happened: per job, round r is superseded only
// after it closed, and rounds close in increasing order.
TEST(RendezvousRoundEventTest, EventsFromManyThreadsArriveInOrder) {
  InMemoryStorage storage;
  FakeClock clock;
  JobManager jobs(&storage, &clock);
  KvManager kv(&storage, &clock, &jobs);
  struct OrderCheck : RoundListener {
    absl::Mutex mu;
    int64_t closed ABSL_GUARDED_BY(mu) = 0;
    bool superseded ABSL_GUARDED_BY(mu) = false;
    int violations ABSL_GUARDED_BY(mu) = 0;
    void OnRoundEvent(const RoundEvent& event) override {
      absl::MutexLock lock(&mu);
      if (event.kind == RoundEvent::Kind::kClosed) {
        if (event.round <= closed) ++violations;
        closed = event.round;
        superseded = false;
      } else if (event.kind == RoundEvent::Kind::kSuperseded) {
        if (event.round != closed || superseded) ++violations;
        superseded = true;
      }
    }
  } order;
  RendezvousManager rdzv(&jobs, &clock, {&kv, &order});
  v1::JoinRequest request;
  request.set_job_id(kJob);
  *request.mutable_config() = Config(ConfigSpec().Min(1).Max(1));
  *request.mutable_node() = Node("host-a", "inc-a");
  constexpr int kRejoins = 300;
  // One thread rejoins (supersede + close of the next round in one call),
  // another reports the latest round's member lost meanwhile.
  std::thread rejoiner([&] {
    v1::JoinRequest r = request;
    for (int i = 0; i < kRejoins; ++i) {
      JoinOutcome outcome;
      rdzv.Join(r, outcome.Callback());
      ASSERT_TRUE(outcome.done());
      r.set_last_round(outcome.assignment().round());
    }
  });
  std::thread loser([&] {
    for (int i = 0; i < kRejoins; ++i) {
      absl::StatusOr<JobPhase> phase = jobs.GetPhase(kJob);
      if (phase.ok() && phase->round > 0) {
        rdzv.MemberLost(kJob, phase->round, 0, "lost");
      }
    }
  });
  rejoiner.join();
  loser.join();
  absl::MutexLock lock(&order.mu);
  EXPECT_EQ(order.violations, 0);
  EXPECT_GE(order.closed, kRejoins);
}

TEST_F(RendezvousManagerTest, SurvivorsReformWithoutTheLostNodeAtOnce) {
  UseConfig(ConfigSpec().Min(2).Max(3).LastCall(absl::Seconds(30)));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  ASSERT_TRUE(c.done());
  rdzv_.MemberLost(kJob, 1, /*rank=*/2, "rank 2 (host-c) lost");
  JoinOutcome a2, b2;
  Rejoin(Node("host-a", "inc-a"), &a2, 1, 5);
  EXPECT_FALSE(a2.done()) << "host-b is still expected back";
  Rejoin(Node("host-b", "inc-b"), &b2, 1, 5);
  ASSERT_TRUE(a2.done() && b2.done()) << "no last call: nobody else to wait for";
  EXPECT_EQ(a2.assignment().world_size(), 2);
  EXPECT_FALSE(a2.assignment().follows_planned_reform()) << "a recovery";
  EXPECT_EQ(b2.assignment().resume_step(), 5);
  EXPECT_EQ(b2.assignment().source_rank(), 0);
}

TEST_F(RendezvousManagerTest, LossReportedAfterTheSurvivorsRejoinedClosesTheRound) {
  UseConfig(ConfigSpec().Min(2).Max(3).LastCall(absl::Seconds(30)));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  // The survivors saw their collective fail before the coordinator saw the
  // loss: their rejoins supersede the round, host-c is still awaited.
  JoinOutcome a2, b2;
  Rejoin(Node("host-a", "inc-a"), &a2, 1, 3);
  Rejoin(Node("host-b", "inc-b"), &b2, 1, 3);
  EXPECT_FALSE(a2.done());
  rdzv_.MemberLost(kJob, 1, /*rank=*/2, "rank 2 (host-c) lost");
  ASSERT_TRUE(a2.done() && b2.done());
  EXPECT_EQ(a2.assignment().round(), 2);
  EXPECT_EQ(a2.assignment().world_size(), 2);
}

TEST_F(RendezvousManagerTest, NodeJoiningARoundBelowMaxIsAdmittedAtAStepBoundary) {
  UseConfig(ConfigSpec().Min(2).Max(3).LastCall(absl::ZeroDuration()));
  JoinOutcome a, b, c, d;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(a.done() && b.done());
  EXPECT_EQ(a.assignment().world_size(), 2);
  EXPECT_TRUE(a.assignment().may_grow()) << "2 of at most 3 nodes";
  // The joiner does not interrupt the round: its members are asked, once,
  // to re-form at their next step boundary, and train on meanwhile.
  Join(Node("host-c", "inc-c"), &c);
  Join(Node("host-d", "inc-d"), &d);
  EXPECT_FALSE(c.done());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  using Event = RoundEvent::Kind;
  using Events = std::vector<EventLog::Entry>;
  EXPECT_EQ(events_.entries(), (Events{{kJob, 1, Event::kClosed},
                                       {kJob, 1, Event::kReformRequested}}));
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kReformRequested);
  // The first member to stop there supersedes the round, giving the reason.
  JoinOutcome a2, b2;
  Rejoin(Node("host-a", "inc-a"), &a2, 1, 40);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_THAT(status.reason(),
              HasSubstr("node 'host-c' joined while round 1 ran 2 of at most 3 "
                        "node(s): the round re-forms at a step boundary to "
                        "admit it"));
  EXPECT_EQ(events_.entries(), (Events{{kJob, 1, Event::kClosed},
                                       {kJob, 1, Event::kReformRequested},
                                       {kJob, 1, Event::kSuperseded}}));
  // Min nodes wait (host-c, host-d, host-a); host-b is awaited meanwhile.
  EXPECT_EQ(rdzv_.PhaseOf(kJob), RoundPhase::kLastCall);
  Rejoin(Node("host-b", "inc-b"), &b2, 1, 40);
  ASSERT_TRUE(a2.done() && b2.done() && c.done());
  EXPECT_EQ(c.assignment().round(), 2);
  EXPECT_EQ(c.assignment().world_size(), 3);
  EXPECT_EQ(c.assignment().rank(), 2);
  EXPECT_EQ(c.assignment().resume_step(), 40);
  EXPECT_FALSE(c.assignment().may_grow()) << "at MAX";
  EXPECT_EQ(a2.assignment().rank(), 0);
  EXPECT_FALSE(d.done()) << "the round is full: host-d stays a spare";
  // Every member learns that round 1 ended only for the planned re-form.
  for (const JoinOutcome* o : {&a2, &b2, &c}) {
    EXPECT_TRUE(o->assignment().follows_planned_reform());
  }
}

// A member lost while the round re-forms as planned makes it a recovery:
// the next round's assignments no longer say it followed a planned re-form.
TEST_F(RendezvousManagerTest, AMemberLostInAPlannedReformMakesItNoLongerPlanned) {
  UseConfig(ConfigSpec().Min(1).Max(3).LastCall(absl::ZeroDuration()));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  ASSERT_TRUE(a.done());
  Join(Node("host-b", "inc-b"), &b);  // asks round 1 to re-form
  JoinOutcome a2;
  Rejoin(Node("host-a", "inc-a"), &a2, 1, 12);  // stops as planned
  ASSERT_TRUE(a2.done() && b.done());
  EXPECT_TRUE(a2.assignment().follows_planned_reform());
  // Round 2 (a, b) re-forms for host-c; host-a dies in it.
  Join(Node("host-c", "inc-c"), &c);
  JoinOutcome b3;
  Rejoin(Node("host-b", "inc-b"), &b3, 2, 20);
  EXPECT_FALSE(b3.done()) << "host-a is awaited";
  rdzv_.MemberLost(kJob, 2, /*rank=*/0, "rank 0 (host-a) lost");
  ASSERT_TRUE(b3.done() && c.done());
  EXPECT_EQ(b3.assignment().round(), 3);
  EXPECT_FALSE(b3.assignment().follows_planned_reform());
  EXPECT_FALSE(c.assignment().follows_planned_reform());
}

TEST_F(RendezvousManagerTest, JoinerOfAFullRoundStaysASpare) {
  UseConfig(ConfigSpec().Min(1).Max(2).LastCall(absl::ZeroDuration()).Nproc(2));
  JoinOutcome a0, a1, b0, b1, c0;
  Join(Node("host-a", "inc-a0"), &a0);
  Join(Node("host-a", "inc-a1"), &a1);  // closes with 1 node of 2 processes
  ASSERT_TRUE(a0.done() && a1.done());
  // One process of a new node does not complete it: nothing changes.
  Join(Node("host-b", "inc-b0"), &b0);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  // Its second completes it: the round (1 of at most 2 nodes) is asked to
  // re-form, and does when its members rejoin.
  Join(Node("host-b", "inc-b1"), &b1);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(events_.Only(RoundEvent::Kind::kReformRequested).size(), 1u);
  Rejoin(Node("host-a", "inc-a0"), &a0, 1, 0);
  Rejoin(Node("host-a", "inc-a1"), &a1, 1, 0);
  ASSERT_TRUE(b1.done());
  EXPECT_EQ(b1.assignment().world_size(), 4);
  // A third node finds the round at max: it waits as a spare.
  Join(Node("host-c", "inc-c0"), &c0);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status().spares_size(), 1);
}

TEST_F(RendezvousManagerTest, LossOfAnOlderRoundChangesNothing) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  rdzv_.MemberLost(kJob, 0, 1, "stale");
  rdzv_.MemberLost(kJob, 2, 1, "future");
  rdzv_.MemberLost(kJob, 1, 5, "no such rank");
  rdzv_.MemberLost("other", 1, 1, "no such job");
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status().round(), 1);
}

TEST_F(RendezvousManagerTest, FreshProcessesResumeFromStepZeroOfRankZero) {
  EXPECT_EQ(ChooseResumeSource({{false, 0}, {false, 9}}),
            (std::pair<int64_t, int>(0, 0)));
  EXPECT_EQ(ChooseResumeSource({{false, 0}, {true, 4}, {true, 4}}),
            (std::pair<int64_t, int>(4, 1)));
  EXPECT_EQ(ChooseResumeSource({{true, 2}, {false, 50}, {true, 3}}),
            (std::pair<int64_t, int>(3, 2)));
  EXPECT_EQ(ChooseResumeSource({}), (std::pair<int64_t, int>(0, 0)));
}

TEST_F(RendezvousManagerTest, JoinOfAnEndedJobIsRefused) {
  UseConfig(ConfigSpec().Min(1).Max(1));
  JoinOutcome a;
  Join(Node("host-a", "inc-a"), &a);
  ASSERT_TRUE(a.done());
  HealthUpdate failed;
  failed.job_state = v1::JOB_STATE_FAILED;
  failed.reason = "rank 0 lost";
  ASSERT_TRUE(jobs_.RecordHealth(kJob, 1, failed).ok());
  JoinOutcome again;
  Join(Node("host-a", "inc-a"), &again, 1);
  ASSERT_TRUE(again.done());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("has ended (failed: rank 0 lost)"));
  EXPECT_EQ(Status().state(), v1::JOB_STATE_FAILED);
}

TEST_F(RendezvousManagerTest, SparesOfAnEndedJobStopWaiting) {
  UseConfig(ConfigSpec().Min(1).Max(1));
  JoinOutcome a, spare;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &spare);
  ASSERT_TRUE(a.done());
  ASSERT_FALSE(spare.done());
  rdzv_.JobEnded(kJob, v1::JOB_STATE_SUCCEEDED, "all 1 member(s) succeeded");
  ASSERT_TRUE(spare.done());
  EXPECT_EQ(spare.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(spare.status().message(),
              HasSubstr("has ended (succeeded: all 1 member(s) succeeded) "
                        "while this process waited"));
  EXPECT_THAT(Status().spares(), IsEmpty());
  rdzv_.JobEnded("unknown", v1::JOB_STATE_FAILED, "no such job");  // a no-op
}

TEST_F(RendezvousManagerTest, NegativeCommittedStepIsInvalidArgument) {
  v1::JoinRequest request = Request(Node("host-a", "inc-a"));
  request.set_committed_step(-1);
  JoinOutcome a;
  rdzv_.Join(request, a.Callback());
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(jobs_.Exists(kJob));
}

// ---------------------------------------------------------------------------
// Rejoins and stale rounds

TEST_F(RendezvousManagerTest, MemberRejoiningSupersedesTheRoundAndKvGoesStale) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(a.done() && b.done());
  ASSERT_TRUE(KvSet(1).ok());

  JoinOutcome a2;
  Join(Node("host-a", "inc-a"), &a2, /*last_round=*/1);
  EXPECT_FALSE(a2.done());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(status.round(), 1);
  EXPECT_THAT(status.reason(), HasSubstr("rank 0"));
  EXPECT_THAT(status.reason(), HasSubstr("rejoined after round 1"));
  ASSERT_EQ(status.waiting_size(), 1);

  // Round 1's key-value calls are refused; round 2 has not closed.
  absl::Status stale = KvSet(1);
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.message(), HasSubstr("round 1 of job 'train' is over"));
  absl::Status early = KvSet(2);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.message(), HasSubstr("has not closed"));

  // Once the other member rejoins, round 2 closes.
  JoinOutcome b2;
  Join(Node("host-b", "inc-b"), &b2, /*last_round=*/1);
  ASSERT_TRUE(a2.done() && b2.done());
  EXPECT_EQ(a2.assignment().round(), 2);
  EXPECT_EQ(b2.assignment().round(), 2);
  EXPECT_EQ(a2.assignment().kv_prefix(), "kv/train/2/");
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status().round(), 2);
  EXPECT_TRUE(KvSet(2).ok());
  EXPECT_EQ(KvSet(1).code(), absl::StatusCode::kAborted);
}

TEST_F(RendezvousManagerTest, SupersedingARoundAbortsItsPendingKvWaits) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b, a2;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  absl::Status wait_status = absl::UnknownError("not called");
  kv_.Wait({kJob, 1}, {"never"}, absl::Seconds(10),
           [&](absl::Status s) { wait_status = s; });
  Join(Node("host-a", "inc-a"), &a2, /*last_round=*/1);
  EXPECT_EQ(wait_status.code(), absl::StatusCode::kAborted);
}

TEST_F(RendezvousManagerTest, NewIncarnationOnAMembersNodeSupersedesTheRound) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b, restarted;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(b.done());
  // host-b's process restarted: a new incarnation with last_round 0.
  Join(Node("host-b", "inc-b-2"), &restarted);
  EXPECT_FALSE(restarted.done());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_THAT(status.reason(), HasSubstr("restarted"));
  EXPECT_EQ(KvSet(1).code(), absl::StatusCode::kAborted);
}

TEST_F(RendezvousManagerTest,
       RetriedJoinGetsTheSameAssignmentWithoutSuperseding) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(a.done());
  ASSERT_TRUE(KvSet(1).ok());

  // The answer to a's join was lost; it retries with last_round 0.
  JoinOutcome retry;
  EXPECT_EQ(Join(Node("host-a", "inc-a"), &retry, /*last_round=*/0), 0u);
  ASSERT_TRUE(retry.done());
  EXPECT_EQ(retry.assignment().SerializeAsString(),
            a.assignment().SerializeAsString());
  EXPECT_EQ(retry.assignment().round(), 1);
  EXPECT_EQ(retry.assignment().rank(), 0);

  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.round(), 1);
  EXPECT_THAT(status.spares(), IsEmpty());
  EXPECT_TRUE(KvSet(1).ok());
}

TEST_F(RendezvousManagerTest, RejoiningNodesKeepTheirNodeRanks) {
  UseConfig(ConfigSpec().Min(3).Max(3));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  ASSERT_EQ(a.assignment().node_rank(), 0);
  ASSERT_EQ(b.assignment().node_rank(), 1);
  ASSERT_EQ(c.assignment().node_rank(), 2);

  // They rejoin in reverse order (c first, superseding round 1).
  JoinOutcome a2, b2, c2;
  Join(Node("host-c", "inc-c"), &c2, 1);
  Join(Node("host-b", "inc-b"), &b2, 1);
  Join(Node("host-a", "inc-a"), &a2, 1);
  ASSERT_TRUE(a2.done() && b2.done() && c2.done());
  EXPECT_EQ(a2.assignment().round(), 2);
  EXPECT_EQ(a2.assignment().node_rank(), 0);
  EXPECT_EQ(b2.assignment().node_rank(), 1);
  EXPECT_EQ(c2.assignment().node_rank(), 2);
  EXPECT_EQ(a2.assignment().rank(), 0);
  EXPECT_EQ(b2.assignment().rank(), 1);
  EXPECT_EQ(c2.assignment().rank(), 2);
}

TEST_F(RendezvousManagerTest, RestartedProcessesGetTheirNodesOldNodeRank) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  // Both restart with new incarnations, b first.
  JoinOutcome a2, b2;
  Join(Node("host-b", "inc-b-2"), &b2);
  Join(Node("host-a", "inc-a-2"), &a2);
  ASSERT_TRUE(a2.done() && b2.done());
  EXPECT_EQ(a2.assignment().node_rank(), 0);
  EXPECT_EQ(b2.assignment().node_rank(), 1);
}

TEST_F(RendezvousManagerTest, NewNodeTakesTheNodeRankThatIsFree) {
  UseConfig(ConfigSpec().Min(3).Max(3));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  Join(Node("host-c", "inc-c"), &c);
  // host-b is replaced by host-d; c and a keep their node ranks.
  JoinOutcome c2, d, a2;
  Join(Node("host-c", "inc-c"), &c2, 1);
  Join(Node("host-d", "inc-d"), &d);
  Join(Node("host-a", "inc-a"), &a2, 1);
  EXPECT_FALSE(a2.done()) << "host-b is awaited until found lost";
  rdzv_.MemberLost(kJob, 1, /*rank=*/1, "rank 1 (host-b) lost");
  ASSERT_TRUE(a2.done() && c2.done() && d.done());
  EXPECT_EQ(a2.assignment().node_rank(), 0);
  EXPECT_EQ(d.assignment().node_rank(), 1);
  EXPECT_EQ(c2.assignment().node_rank(), 2);
}

TEST_F(RendezvousManagerTest,
       SameIncarnationRejoinWhilePendingReplacesTheOldJoin) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome first, second, b;
  Join(Node("host-a", "inc-a"), &first);
  Join(Node("host-a", "inc-a"), &second);
  ASSERT_TRUE(first.done());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(first.status().message(), HasSubstr("replaced by a newer join"));
  EXPECT_FALSE(second.done());
  EXPECT_EQ(Status().waiting_size(), 1);

  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(second.done());
  EXPECT_EQ(second.assignment().rank(), 0);
  EXPECT_EQ(second.assignment().world_size(), 2);
  EXPECT_EQ(first.calls(), 1);
}

TEST_F(RendezvousManagerTest, ExtraProcessOnAFullNodeReplacesItsOldestProcess) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(1));
  JoinOutcome old_proc, new_proc;
  Join(Node("host-a", "inc-old"), &old_proc);
  Join(Node("host-a", "inc-new"), &new_proc);
  ASSERT_TRUE(old_proc.done());
  EXPECT_EQ(old_proc.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(old_proc.status().message(),
              HasSubstr("replaced by a newer process on node 'host-a'"));
  EXPECT_FALSE(new_proc.done());
  ASSERT_EQ(Status().waiting_size(), 1);
  EXPECT_EQ(Status().waiting(0).node().incarnation_id(), "inc-new");
}

// ---------------------------------------------------------------------------
// Restart on durable state

// A coordinator restarted on the same storage: fresh managers that load what
// the first ones wrote, in the order Coordinator::Start restores them.
class Restarted {
 public:
  Restarted(Storage* storage, Clock* clock)
      : jobs_(storage, clock), kv_(storage, clock, &jobs_),
        rdzv_(&jobs_, clock, {&kv_}) {}

  absl::Status Restore() {
    absl::Status loaded = jobs_.LoadFromStorage();
    if (!loaded.ok()) return loaded;
    for (const v1::JobStatus& job : jobs_.List()) {
      if (job.round() < 1) continue;
      absl::Status kv = kv_.RestoreRound(
          job.config().job_id(), job.round(),
          job.state() != v1::JOB_STATE_WAITING);
      if (!kv.ok()) return kv;
    }
    return rdzv_.Restore();
  }

  v1::JobStatus Status() const {
    absl::StatusOr<v1::JobStatus> status = jobs_.Get(kJob);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  JobManager jobs_;
  KvManager kv_;
  RendezvousManager rdzv_;
};

class RendezvousRestoreTest : public RendezvousManagerTest {
 protected:
  // A running round of three nodes, a to c, and a restart.
  void RunThreeNodesAndRestart(const ConfigSpec& spec) {
    UseConfig(spec);
    Join(Node("host-a", "inc-a"), &a_);
    Join(Node("host-b", "inc-b"), &b_);
    Join(Node("host-c", "inc-c"), &c_);
    ASSERT_TRUE(a_.done() && b_.done() && c_.done());
  }

  absl::Status RestartNow() { return restarted_.Restore(); }

  // Records rank `rank` of round 1 LOST, as failure detection does before it
  // tells the rendezvous.
  void RecordLost(int rank, const std::string& reason) {
    HealthUpdate update;
    update.members.push_back({rank, v1::MEMBER_STATE_LOST, "stream broke"});
    update.job_state = v1::JOB_STATE_DEGRADED;
    update.reason = reason;
    ASSERT_TRUE(jobs_.RecordHealth(kJob, 1, update).ok());
  }

  void RejoinRestarted(const v1::NodeDescriptor& node, JoinOutcome* outcome,
                       int64_t last_round, int64_t committed_step) {
    v1::JoinRequest request = Request(node, last_round);
    request.set_has_state(true);
    request.set_committed_step(committed_step);
    restarted_.rdzv_.Join(request, outcome->Callback());
  }

  JoinOutcome a_, b_, c_;
  Restarted restarted_{&storage_, &clock_};
};

TEST_F(RendezvousRestoreTest, RunningRoundRepeatsAnswersAndReformsOnALoss) {
  RunThreeNodesAndRestart(ConfigSpec().Min(2).Max(3));
  ASSERT_TRUE(RestartNow().ok());
  EXPECT_EQ(restarted_.Status().state(), v1::JOB_STATE_RUNNING);
  // A join whose answer the crash lost gets the same assignment again.
  JoinOutcome again;
  restarted_.rdzv_.Join(Request(Node("host-b", "inc-b")), again.Callback());
  ASSERT_TRUE(again.done());
  EXPECT_EQ(again.assignment().SerializeAsString(),
            b_.assignment().SerializeAsString());

  // A loss reported after the restart re-forms the round, numbered on.
  restarted_.rdzv_.MemberLost(kJob, 1, /*rank=*/0, "rank 0 (host-a) lost");
  EXPECT_EQ(restarted_.Status().state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(restarted_.kv_.Set({kJob, 1}, "k", "v").code(),
            absl::StatusCode::kAborted);
  JoinOutcome b2, c2;
  RejoinRestarted(Node("host-b", "inc-b"), &b2, 1, 4);
  EXPECT_FALSE(b2.done()) << "host-c is still awaited";
  RejoinRestarted(Node("host-c", "inc-c"), &c2, 1, 5);
  ASSERT_TRUE(b2.done() && c2.done());
  EXPECT_EQ(c2.assignment().round(), 2);
  EXPECT_EQ(c2.assignment().world_size(), 2);
  EXPECT_EQ(c2.assignment().resume_step(), 5);
  EXPECT_TRUE(restarted_.kv_.Set({kJob, 2}, "k", "v").ok());
  EXPECT_EQ(restarted_.Status().recovery_count(), 1);
}

TEST_F(RendezvousRestoreTest, ReformingRoundAwaitsOnlyTheNodesNotLost) {
  RunThreeNodesAndRestart(ConfigSpec().Min(2).Max(3).LastCall(absl::Seconds(30)));
  RecordLost(2, "rank 2 (host-c) lost: stream broke");
  rdzv_.MemberLost(kJob, 1, /*rank=*/2, "rank 2 (host-c) lost: stream broke");
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(RestartNow().ok());
  EXPECT_EQ(restarted_.Status().state(), v1::JOB_STATE_WAITING);
  JoinOutcome a2, b2;
  RejoinRestarted(Node("host-a", "inc-a"), &a2, 1, 3);
  EXPECT_FALSE(a2.done()) << "host-b is still awaited";
  clock_.Advance(absl::Seconds(1));
  RejoinRestarted(Node("host-b", "inc-b"), &b2, 1, 3);
  ASSERT_TRUE(a2.done() && b2.done()) << "no last call: host-c was lost";
  EXPECT_EQ(b2.assignment().round(), 2);
  EXPECT_EQ(a2.assignment().rank(), 0) << "returning nodes keep their ranks";
  EXPECT_EQ(b2.assignment().rank(), 1);
  const v1::JobStatus status = restarted_.Status();
  ASSERT_EQ(status.recoveries_size(), 1);
  EXPECT_EQ(status.recoveries(0).cause(), "rank 2 (host-c) lost: stream broke");
  EXPECT_EQ(status.recoveries(0).failed_round(), 1);
  EXPECT_EQ(FromProtoDuration(status.recoveries(0).rendezvous()),
            absl::Seconds(2))
      << "from the loss before the restart";
}

TEST_F(RendezvousRestoreTest, RoundWithALostMemberIsSupersededAtRestore) {
  RunThreeNodesAndRestart(ConfigSpec().Min(2).Max(3));
  // The crash came after the loss was recorded, before the supersede.
  RecordLost(1, "rank 1 (host-b) lost: missed 3 heartbeats");
  ASSERT_TRUE(RestartNow().ok());
  EXPECT_EQ(restarted_.Status().state(), v1::JOB_STATE_WAITING);
  JoinOutcome a2, c2;
  RejoinRestarted(Node("host-a", "inc-a"), &a2, 1, 2);
  RejoinRestarted(Node("host-c", "inc-c"), &c2, 1, 2);
  ASSERT_TRUE(a2.done() && c2.done()) << "host-b is not awaited";
  EXPECT_EQ(a2.assignment().world_size(), 2);
}

TEST_F(RendezvousRestoreTest, DamagedRecordIsDataLoss) {
  RunThreeNodesAndRestart(ConfigSpec().Min(3).Max(3));
  // Round 1's members, in their first (and only) part (server/job_records.h).
  const std::string key = absl::StrCat(
      "jobs/", kJob, "/members/00000000000000000001/00000000000000000000");
  absl::StatusOr<std::string> stored = storage_.Get(key);
  ASSERT_TRUE(stored.ok()) << stored.status();
  v1::StoredMembers members;
  ASSERT_TRUE(members.ParseFromString(*stored));
  members.mutable_members(1)->set_rank(7);
  ASSERT_TRUE(storage_.Put(key, members.SerializeAsString()).ok());
  absl::Status restored = RestartNow();
  EXPECT_EQ(restored.code(), absl::StatusCode::kDataLoss) << restored;
  EXPECT_THAT(restored.message(), HasSubstr("damaged"));
}

// ---------------------------------------------------------------------------
// Backend negotiation

TEST_F(RendezvousManagerTest, AllCudaNodesWithNcclNegotiateNccl) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a", Device::kCudaNccl), &a);
  Join(Node("host-b", "inc-b", Device::kCudaNccl), &b);
  EXPECT_EQ(a.assignment().backend(), v1::BACKEND_NCCL);
  EXPECT_EQ(b.assignment().backend(), v1::BACKEND_NCCL);
  EXPECT_EQ(Status().backend(), v1::BACKEND_NCCL);
}

TEST_F(RendezvousManagerTest, MixedNodesNegotiateGloo) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a", Device::kCudaNccl), &a);
  Join(Node("host-b", "inc-b", Device::kCpu), &b);
  EXPECT_EQ(a.assignment().backend(), v1::BACKEND_GLOO);
  EXPECT_EQ(b.assignment().backend(), v1::BACKEND_GLOO);
  EXPECT_EQ(Status().backend(), v1::BACKEND_GLOO);
}

TEST_F(RendezvousManagerTest, CudaWithoutNcclNegotiatesGloo) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a", Device::kCudaNccl), &a);
  Join(Node("host-b", "inc-b", Device::kCudaNoNccl), &b);
  EXPECT_EQ(a.assignment().backend(), v1::BACKEND_GLOO);
}

TEST_F(RendezvousManagerTest, JobForcingNcclRefusesACpuJoiner) {
  UseConfig(ConfigSpec().Min(2).Max(2).Backend(v1::BACKEND_NCCL));
  JoinOutcome a, cpu;
  Join(Node("host-a", "inc-a", Device::kCudaNccl), &a);
  EXPECT_EQ(Join(Node("host-b", "inc-b", Device::kCpu), &cpu), 0u);
  ASSERT_TRUE(cpu.done());
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cpu.status().message(),
              HasSubstr("job 'train' requires the nccl backend"));
  EXPECT_THAT(cpu.status().message(), HasSubstr("host-b"));
  // The refused process does not take part.
  EXPECT_FALSE(a.done());
  EXPECT_EQ(Status().waiting_size(), 1);
}

TEST_F(RendezvousManagerTest, JobForcingNcclWithCudaNodesUsesNccl) {
  UseConfig(ConfigSpec().Min(1).Max(1).Backend(v1::BACKEND_NCCL));
  JoinOutcome a;
  Join(Node("host-a", "inc-a", Device::kCudaNccl), &a);
  EXPECT_EQ(a.assignment().backend(), v1::BACKEND_NCCL);
}

TEST_F(RendezvousManagerTest, JobForcingGlooUsesGlooEvenOnCudaNodes) {
  UseConfig(ConfigSpec().Min(2).Max(2).Backend(v1::BACKEND_GLOO));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a", Device::kCudaNccl), &a);
  Join(Node("host-b", "inc-b", Device::kCudaNccl), &b);
  EXPECT_EQ(a.assignment().backend(), v1::BACKEND_GLOO);
  EXPECT_EQ(b.assignment().backend(), v1::BACKEND_GLOO);
}

TEST(NegotiateBackendTest, PicksNcclOnlyWhenEveryMemberCanUseIt) {
  const v1::NodeDescriptor gpu = Node("h", "i", Device::kCudaNccl);
  const v1::NodeDescriptor cpu = Node("h", "i", Device::kCpu);
  EXPECT_EQ(NegotiateBackend(v1::BACKEND_AUTO, {gpu, gpu}), v1::BACKEND_NCCL);
  EXPECT_EQ(NegotiateBackend(v1::BACKEND_AUTO, {gpu, cpu}), v1::BACKEND_GLOO);
  EXPECT_EQ(NegotiateBackend(v1::BACKEND_AUTO, {}), v1::BACKEND_GLOO);
  EXPECT_EQ(NegotiateBackend(v1::BACKEND_GLOO, {gpu}), v1::BACKEND_GLOO);
  EXPECT_EQ(NegotiateBackend(v1::BACKEND_NCCL, {gpu}), v1::BACKEND_NCCL);
}

TEST(NegotiateBackendTest, SimulatedGpusUseNcclButNeverWithRealOnes) {
  const v1::NodeDescriptor gpu = Node("h", "i", Device::kCudaNccl);
  v1::NodeDescriptor sim = gpu;
  sim.set_device_type(v1::DEVICE_TYPE_SIM);
  EXPECT_TRUE(CanUseNccl(sim));
  EXPECT_EQ(NegotiateBackend(v1::BACKEND_AUTO, {sim, sim}), v1::BACKEND_NCCL);
  EXPECT_EQ(NegotiateBackend(v1::BACKEND_AUTO, {sim, gpu}), v1::BACKEND_GLOO);
}

TEST(CanUseNcclTest, NeedsCudaDevicesAndNccl) {
  EXPECT_TRUE(CanUseNccl(Node("h", "i", Device::kCudaNccl)));
  EXPECT_FALSE(CanUseNccl(Node("h", "i", Device::kCpu)));
  EXPECT_FALSE(CanUseNccl(Node("h", "i", Device::kCudaNoNccl)));
  v1::NodeDescriptor no_devices = Node("h", "i", Device::kCudaNccl);
  no_devices.set_device_count(0);
  EXPECT_FALSE(CanUseNccl(no_devices));
}

// ---------------------------------------------------------------------------
// Bad joins

TEST_F(RendezvousManagerTest,
       SecondJoinWithADifferentConfigIsFailedPrecondition) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  UseConfig(ConfigSpec().Min(3).Max(3));
  EXPECT_EQ(Join(Node("host-b", "inc-b"), &b), 0u);
  ASSERT_TRUE(b.done());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.status().message(), HasSubstr("different config"));
  EXPECT_EQ(Status().config().min_nodes(), 2);
  EXPECT_EQ(Status().waiting_size(), 1);
}

TEST_F(RendezvousManagerTest, LaterJoinsMayLeaveTheConfigOut) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  v1::JoinRequest request = Request(Node("host-b", "inc-b"));
  request.clear_config();
  rdzv_.Join(request, b.Callback());
  ASSERT_TRUE(b.done());
  EXPECT_EQ(b.assignment().world_size(), 2);
}

TEST_F(RendezvousManagerTest, JoiningAJobCreatedAheadUsesItsConfig) {
  v1::JobConfig config = Config(ConfigSpec().Min(1).Max(1));
  ASSERT_TRUE(jobs_.Create(config).ok());
  v1::JoinRequest request = Request(Node("host-a", "inc-a"));
  request.clear_config();
  JoinOutcome a;
  rdzv_.Join(request, a.Callback());
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.assignment().world_size(), 1);
}

TEST_F(RendezvousManagerTest, JoinWithEmptyConfigUsesTheJobsConfig) {
  UseConfig(ConfigSpec().Min(2).Max(2));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  // A later join whose config holds only the job id takes the job's settings.
  v1::JoinRequest bare = Request(Node("host-b", "inc-b"));
  bare.mutable_config()->Clear();
  bare.mutable_config()->set_job_id(kJob);
  rdzv_.Join(bare, b.Callback());
  ASSERT_TRUE(a.done() && b.done());
  EXPECT_TRUE(b.status().ok()) << b.status();
  EXPECT_EQ(b.assignment().world_size(), 2);
}

TEST_F(RendezvousManagerTest, JoinWithoutConfigOfUnknownJobIsNotFound) {
  v1::JoinRequest request = Request(Node("host-a", "inc-a"));
  request.clear_config();
  JoinOutcome a;
  EXPECT_EQ(rdzv_.Join(request, a.Callback()), 0u);
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(a.status().message(), HasSubstr("'train' does not exist"));
  EXPECT_FALSE(jobs_.Exists(kJob));
}

TEST_F(RendezvousManagerTest, BadJobIdIsInvalidArgumentAndChangesNothing) {
  v1::JoinRequest request = Request(Node("host-a", "inc-a"));
  request.set_job_id("Not_A_Label");
  request.mutable_config()->set_job_id("Not_A_Label");
  JoinOutcome a;
  EXPECT_EQ(rdzv_.Join(request, a.Callback()), 0u);
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("not a DNS label"));
  EXPECT_FALSE(jobs_.Exists("Not_A_Label"));
  EXPECT_THAT(jobs_.List(), IsEmpty());
}

TEST_F(RendezvousManagerTest,
       MissingIncarnationIsInvalidArgumentAndChangesNothing) {
  JoinOutcome a;
  EXPECT_EQ(Join(Node("host-a", ""), &a), 0u);
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("incarnation_id"));
  EXPECT_FALSE(jobs_.Exists(kJob));
  v1::JobStatus status;
  rdzv_.DescribeWaiting(kJob, &status);
  EXPECT_THAT(status.waiting(), IsEmpty());
}

TEST_F(RendezvousManagerTest, NodeWithoutIdOrHostnameIsInvalidArgument) {
  JoinOutcome a;
  Join(Node("", "inc-a"), &a);
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("node_id or a hostname"));
  EXPECT_FALSE(jobs_.Exists(kJob));
}

TEST_F(RendezvousManagerTest, BadConfigIsInvalidArgumentAndChangesNothing) {
  UseConfig(ConfigSpec().Min(3).Max(2));
  JoinOutcome a;
  Join(Node("host-a", "inc-a"), &a);
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(jobs_.Exists(kJob));
}

TEST(ValidateNodeDescriptorTest, ChecksEachField) {
  EXPECT_TRUE(ValidateNodeDescriptor(Node("h", "i")).ok());
  struct Case {
    const char* what;
    void (*mutate)(v1::NodeDescriptor*);
  };
  const Case cases[] = {
      {"incarnation_id",
       [](v1::NodeDescriptor* n) { n->clear_incarnation_id(); }},
      {"incarnation_id",
       [](v1::NodeDescriptor* n) {
         n->set_incarnation_id(std::string(129, 'i'));
       }},
      {"node_id or a hostname",
       [](v1::NodeDescriptor* n) { n->clear_hostname(); }},
      {"at most 253 bytes",
       [](v1::NodeDescriptor* n) { n->set_node_id(std::string(254, 'n')); }},
      {"addresses", [](v1::NodeDescriptor* n) { n->add_addresses(""); }},
      {"node.pid", [](v1::NodeDescriptor* n) { n->set_pid(-1); }},
      {"device_type",
       [](v1::NodeDescriptor* n) {
         n->set_device_type(static_cast<v1::DeviceType>(9));
       }},
      {"device_count", [](v1::NodeDescriptor* n) { n->set_device_count(-1); }},
      {"device_count",
       [](v1::NodeDescriptor* n) { n->set_device_count(1025); }},
  };
  for (const Case& c : cases) {
    v1::NodeDescriptor node = Node("h", "i");
    c.mutate(&node);
    absl::Status status = ValidateNodeDescriptor(node);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(status.message(), HasSubstr(c.what));
  }
  v1::NodeDescriptor many = Node("h", "i");
  for (int i = 0; i < 64; ++i) many.add_addresses("10.0.0.2");
  EXPECT_EQ(ValidateNodeDescriptor(many).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// CancelJoin and Leave

TEST_F(RendezvousManagerTest, CancelJoinRemovesTheWaiterAndCancelsTheLastCall) {
  UseConfig(ConfigSpec().Min(2).Max(3).LastCall(absl::Seconds(30)));
  JoinOutcome a, b, c;
  Join(Node("host-a", "inc-a"), &a);
  uint64_t ticket = Join(Node("host-b", "inc-b"), &b);  // last call starts
  ASSERT_NE(ticket, 0u);
  AdvanceAndPoll(absl::Seconds(10));
  rdzv_.CancelJoin(ticket);
  ASSERT_TRUE(b.done());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kCancelled);
  ASSERT_EQ(Status().waiting_size(), 1);
  EXPECT_EQ(Status().waiting(0).node().incarnation_id(), "inc-a");

  // Below min: the old last call no longer closes the round.
  AdvanceAndPoll(absl::Seconds(30));
  EXPECT_FALSE(a.done());

  // Back at min, a new last call starts from now.
  Join(Node("host-c", "inc-c"), &c);
  AdvanceAndPoll(absl::Seconds(30) - absl::Milliseconds(1));
  EXPECT_FALSE(a.done());
  AdvanceAndPoll(absl::Milliseconds(1));
  ASSERT_TRUE(a.done() && c.done());
  EXPECT_EQ(a.assignment().world_size(), 2);
  EXPECT_EQ(c.assignment().rank(), 1);
  EXPECT_EQ(b.calls(), 1);
}

TEST_F(RendezvousManagerTest, CancelJoinAfterCompletionIsANoOp) {
  UseConfig(ConfigSpec().Min(1).Max(1));
  JoinOutcome a;
  uint64_t ticket = Join(Node("host-a", "inc-a"), &a);
  ASSERT_TRUE(a.done());
  rdzv_.CancelJoin(ticket);
  rdzv_.CancelJoin(0);
  rdzv_.CancelJoin(987654);
  EXPECT_EQ(a.calls(), 1);
  EXPECT_TRUE(a.status().ok());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(RendezvousManagerTest, LeaveRemovesTheWaiterAndCancelsTheLastCall) {
  UseConfig(ConfigSpec().Min(2).Max(3).LastCall(absl::Seconds(30)));
  JoinOutcome a, b;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &b);
  ASSERT_TRUE(rdzv_.Leave(kJob, "inc-b").ok());
  ASSERT_TRUE(b.done());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(b.status().message(), HasSubstr("left the job"));
  AdvanceAndPoll(absl::Seconds(30));
  EXPECT_FALSE(a.done());
  EXPECT_EQ(Status().waiting_size(), 1);
}

TEST_F(RendezvousManagerTest, LeaveRemovesASpare) {
  UseConfig(ConfigSpec().Min(1).Max(1));
  JoinOutcome a, spare;
  Join(Node("host-a", "inc-a"), &a);
  Join(Node("host-b", "inc-b"), &spare);
  ASSERT_EQ(Status().spares_size(), 1);
  ASSERT_TRUE(rdzv_.Leave(kJob, "inc-b").ok());
  ASSERT_TRUE(spare.done());
  EXPECT_EQ(spare.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(Status().spares(), IsEmpty());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(RendezvousManagerTest, LeaveOfUnknownProcessOrJobIsNotFound) {
  UseConfig(ConfigSpec().Min(1).Max(1));
  absl::Status no_job = rdzv_.Leave(kJob, "inc-a");
  EXPECT_EQ(no_job.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_job.message(), HasSubstr("job 'train'"));
  JoinOutcome a;
  Join(Node("host-a", "inc-a"), &a);
  // Members of the running round leave by finishing, not through Leave.
  absl::Status member = rdzv_.Leave(kJob, "inc-a");
  EXPECT_EQ(member.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(member.message(),
              HasSubstr("no process with incarnation 'inc-a'"));
  EXPECT_EQ(rdzv_.Leave(kJob, "inc-zzz").code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// Concurrency

TEST_F(RendezvousManagerTest, ConcurrentJoinsGetDistinctContiguousRanks) {
  constexpr int kNodes = 64;
  UseConfig(ConfigSpec().Min(kNodes).Max(kNodes));
  absl::Mutex mu;
  std::vector<absl::StatusOr<v1::Assignment>> results;
  std::vector<std::thread> threads;
  for (int i = 0; i < kNodes; ++i) {
    threads.emplace_back([&, i] {
      rdzv_.Join(
          Request(Node(absl::StrCat("host-", i), absl::StrCat("inc-", i))),
          [&](absl::StatusOr<v1::Assignment> result) {
            absl::MutexLock lock(&mu);
            results.push_back(std::move(result));
          });
    });
  }
  for (std::thread& thread : threads) thread.join();

  absl::MutexLock lock(&mu);
  ASSERT_EQ(results.size(), static_cast<size_t>(kNodes));
  std::set<int> ranks;
  std::set<int> node_ranks;
  for (const absl::StatusOr<v1::Assignment>& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->round(), 1);
    EXPECT_EQ(result->world_size(), kNodes);
    EXPECT_EQ(result->num_nodes(), kNodes);
    EXPECT_EQ(result->rank(), result->node_rank());
    ranks.insert(result->rank());
    node_ranks.insert(result->node_rank());
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kNodes));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), kNodes - 1);
  EXPECT_EQ(node_ranks.size(), static_cast<size_t>(kNodes));
  EXPECT_EQ(jobs_.Get(kJob)->members_size(), kNodes);
}

TEST_F(RendezvousManagerTest, ConcurrentJoinsGroupProcessesIntoNodes) {
  constexpr int kNodes = 8;
  constexpr int kNproc = 8;
  UseConfig(ConfigSpec().Min(kNodes).Max(kNodes).Nproc(kNproc));
  absl::Mutex mu;
  std::vector<std::pair<std::string, absl::StatusOr<v1::Assignment>>> results;
  std::vector<std::thread> threads;
  for (int i = 0; i < kNodes * kNproc; ++i) {
    threads.emplace_back([&, i] {
      const std::string host = absl::StrCat("host-", i % kNodes);
      rdzv_.Join(Request(Node(host, absl::StrCat("inc-", i))),
                 [&, host](absl::StatusOr<v1::Assignment> result) {
                   absl::MutexLock lock(&mu);
                   results.emplace_back(host, std::move(result));
                 });
    });
  }
  for (std::thread& thread : threads) thread.join();

  absl::MutexLock lock(&mu);
  ASSERT_EQ(results.size(), static_cast<size_t>(kNodes * kNproc));
  std::set<int> ranks;
  std::map<std::string, std::set<int>> node_rank_of_host;
  std::map<std::string, std::set<int>> local_ranks_of_host;
  for (const auto& [host, result] : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->world_size(), kNodes * kNproc);
    EXPECT_EQ(result->rank(),
              result->node_rank() * kNproc + result->local_rank());
    ranks.insert(result->rank());
    node_rank_of_host[host].insert(result->node_rank());
    local_ranks_of_host[host].insert(result->local_rank());
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kNodes * kNproc));
  EXPECT_EQ(*ranks.rbegin(), kNodes * kNproc - 1);
  std::set<int> node_ranks;
  for (const auto& [host, node_rank] : node_rank_of_host) {
    EXPECT_EQ(node_rank.size(), 1u) << host;  // one node rank per host
    node_ranks.insert(*node_rank.begin());
    EXPECT_EQ(local_ranks_of_host[host].size(), static_cast<size_t>(kNproc));
  }
  EXPECT_EQ(node_ranks.size(), static_cast<size_t>(kNodes));
}

// ---------------------------------------------------------------------------
// Node joins: every process of a node in one call

class NodeJoinOutcome
    : public Outcome<absl::StatusOr<std::vector<v1::Assignment>>> {
 public:
  absl::Status status() const { return result().status(); }
  // The assignments; none (and a test failure) when there are none.
  std::vector<v1::Assignment> assignments() const {
    auto r = result();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::vector<v1::Assignment>();
  }
};

class NodeJoinTest : public RendezvousManagerTest {
 protected:
  // A node join of `host` with processes named `host`-0 .. `host`-(n-1).
  v1::JoinNodeRequest NodeRequest(const std::string& host, int n,
                                  int64_t last_round = 0) const {
    v1::JoinNodeRequest request;
    request.set_job_id(kJob);
    *request.mutable_config() = config_;
    for (int i = 0; i < n; ++i) {
      v1::ProcessJoin* process = request.add_processes();
      *process->mutable_node() = Node(host, absl::StrCat(host, "-", i));
      process->set_last_round(last_round);
    }
    return request;
  }

  std::vector<uint64_t> JoinNode(const v1::JoinNodeRequest& request,
                                 NodeJoinOutcome* outcome) {
    return rdzv_.JoinNode(request, outcome->Callback());
  }
};

// A node agent whose process died rejoins with how it ended: that is the
// recovery's cause (a loss reported before the round closes does not
// replace it), and with no process holding state the round did not resume
// in place.
TEST_F(NodeJoinTest, AnAgentsRejoinReasonIsTheCause) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(2));
  NodeJoinOutcome a, b;
  JoinNode(NodeRequest("host-a", 2), &a);
  JoinNode(NodeRequest("host-b", 2), &b);
  ASSERT_TRUE(a.done() && b.done());
  const std::string why = "rank 1 (pid 4242) exited with code 137 (SIGKILL)";
  v1::JoinNodeRequest again = NodeRequest("host-a", 2, /*last_round=*/1);
  again.set_rejoin_reason(why);
  NodeJoinOutcome a2, b2;
  JoinNode(again, &a2);
  EXPECT_EQ(Status().reason(), why);
  rdzv_.MemberLost(kJob, 1, /*rank=*/2, "rank 2 (host-b) lost: late report");
  JoinNode(NodeRequest("host-b", 2, /*last_round=*/1), &b2);
  ASSERT_TRUE(a2.done() && b2.done());
  const v1::JobStatus status = Status();
  ASSERT_EQ(status.recoveries_size(), 1);
  EXPECT_EQ(status.recoveries(0).cause(), why);
  EXPECT_FALSE(status.recoveries(0).resumed_in_place());

  v1::JoinNodeRequest long_reason = NodeRequest("host-a", 2, /*last_round=*/2);
  long_reason.set_rejoin_reason(std::string(1025, 'x'));
  NodeJoinOutcome refused;
  JoinNode(long_reason, &refused);
  ASSERT_TRUE(refused.done());
  EXPECT_EQ(refused.status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status().round(), 2) << "a refused join changes nothing";
}

TEST_F(NodeJoinTest, OneAnswerCarriesEveryProcessAssignmentInRequestOrder) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(4));
  NodeJoinOutcome a, b;
  EXPECT_EQ(JoinNode(NodeRequest("host-a", 4), &a).size(), 4u);
  EXPECT_FALSE(a.done());
  JoinNode(NodeRequest("host-b", 4), &b);
  ASSERT_TRUE(a.done());
  ASSERT_TRUE(b.done());
  EXPECT_EQ(a.calls(), 1);
  std::set<int> ranks;
  for (const NodeJoinOutcome* node : {&a, &b}) {
    std::vector<v1::Assignment> assignments = node->assignments();
    ASSERT_EQ(assignments.size(), 4u);
    for (int local = 0; local < 4; ++local) {
      const v1::Assignment& assignment = assignments[local];
      EXPECT_EQ(assignment.local_rank(), local);
      EXPECT_EQ(assignment.world_size(), 8);
      EXPECT_EQ(assignment.rank(), assignment.node_rank() * 4 + local);
      ranks.insert(assignment.rank());
    }
  }
  EXPECT_EQ(ranks.size(), 8u);
  EXPECT_EQ(Status().members_size(), 8);
}

TEST_F(NodeJoinTest, NodeJoinsAndSingleJoinsFormOneRound) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(2));
  NodeJoinOutcome a;
  JoinOutcome b0, b1;
  JoinNode(NodeRequest("host-a", 2), &a);
  Join(Node("host-b", "b-0"), &b0);
  EXPECT_FALSE(a.done());
  Join(Node("host-b", "b-1"), &b1);
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.assignments().size(), 2u);
  EXPECT_EQ(b0.assignment().round(), 1);
  EXPECT_EQ(b1.assignment().world_size(), 4);
}

TEST_F(NodeJoinTest, PartOfANodeWaitsForTheRestOfIt) {
  UseConfig(ConfigSpec().Min(1).Max(1).Nproc(3));
  NodeJoinOutcome first_two;
  JoinOutcome third;
  JoinNode(NodeRequest("host-a", 2), &first_two);
  EXPECT_FALSE(first_two.done());
  Join(Node("host-a", "host-a-2"), &third);
  ASSERT_TRUE(first_two.done());
  EXPECT_EQ(first_two.assignments()[1].local_rank(), 1);
  EXPECT_EQ(third.assignment().local_rank(), 2);
}

TEST_F(NodeJoinTest, BadNodeJoinsAreRefusedAndCreateNoJob) {
  UseConfig(ConfigSpec().Min(1).Max(1).Nproc(2));
  v1::JoinNodeRequest empty = NodeRequest("host-a", 0);
  v1::JoinNodeRequest mixed = NodeRequest("host-a", 2);
  *mixed.mutable_processes(1)->mutable_node() = Node("host-b", "b-0");
  v1::JoinNodeRequest twice = NodeRequest("host-a", 2);
  *twice.mutable_processes(1)->mutable_node() = Node("host-a", "host-a-0");
  v1::JoinNodeRequest too_many = NodeRequest("host-a", 3);
  const std::vector<std::pair<v1::JoinNodeRequest, std::string>> cases = {
      {empty, "lists no processes"},
      {mixed, "mixes nodes 'host-a' and 'host-b'"},
      {twice, "incarnation 'host-a-0' twice"},
      {too_many, "lists 3 processes; job 'train' runs 2 per node"},
  };
  for (const auto& [request, why] : cases) {
    NodeJoinOutcome outcome;
    EXPECT_THAT(JoinNode(request, &outcome), IsEmpty());
    ASSERT_TRUE(outcome.done()) << why;
    EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(outcome.status().message(), HasSubstr(why));
    EXPECT_EQ(jobs_.Get(kJob).status().code(), absl::StatusCode::kNotFound)
        << why;
  }
}

TEST_F(NodeJoinTest, TooManyProcessesForAnExistingJobAreRefused) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(2));
  JoinOutcome other;
  Join(Node("host-b", "b-0"), &other);
  v1::JoinNodeRequest request = NodeRequest("host-a", 3);
  request.clear_config();  // the job's config applies
  NodeJoinOutcome outcome;
  JoinNode(request, &outcome);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status().waiting_size(), 1);
}

TEST_F(NodeJoinTest, AFailedProcessFailsTheNodeJoinAndWithdrawsTheRest) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(2).JoinTimeout(absl::Seconds(10)));
  NodeJoinOutcome a;
  JoinNode(NodeRequest("host-a", 2), &a);
  ASSERT_EQ(Status().waiting_size(), 2);
  AdvanceAndPoll(absl::Seconds(11));
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.calls(), 1);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Status().waiting_size(), 0);
}

TEST_F(NodeJoinTest, CancellingTheTicketsWithdrawsEveryProcess) {
  UseConfig(ConfigSpec().Min(2).Max(2).Nproc(3));
  NodeJoinOutcome a;
  std::vector<uint64_t> tickets = JoinNode(NodeRequest("host-a", 3), &a);
  ASSERT_EQ(tickets.size(), 3u);
  for (uint64_t ticket : tickets) rdzv_.CancelJoin(ticket);
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.calls(), 1);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Status().waiting_size(), 0);
}

TEST_F(NodeJoinTest, ARetriedNodeJoinGetsTheSameAssignmentsAgain) {
  UseConfig(ConfigSpec().Min(1).Max(1).Nproc(2));
  NodeJoinOutcome first, retry;
  JoinNode(NodeRequest("host-a", 2), &first);
  ASSERT_TRUE(first.done());
  JoinNode(NodeRequest("host-a", 2), &retry);  // the answer was lost
  ASSERT_TRUE(retry.done());
  std::vector<v1::Assignment> again = retry.assignments();
  std::vector<v1::Assignment> original = first.assignments();
  ASSERT_EQ(again.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(again[i].rank(), original[i].rank());
    EXPECT_EQ(again[i].round(), 1);
  }
  EXPECT_EQ(jobs_.Get(kJob)->round(), 1);  // not superseded
}

TEST_F(NodeJoinTest, ANodeRejoiningAfterItsRoundStartsTheNext) {
  UseConfig(ConfigSpec().Min(1).Max(1).Nproc(2));
  NodeJoinOutcome first, rejoin;
  JoinNode(NodeRequest("host-a", 2), &first);
  ASSERT_TRUE(first.done());
  JoinNode(NodeRequest("host-a", 2, /*last_round=*/1), &rejoin);
  ASSERT_TRUE(rejoin.done());
  EXPECT_EQ(rejoin.assignments()[0].round(), 2);
  EXPECT_EQ(rejoin.assignments()[1].round(), 2);
}

TEST_F(RendezvousManagerTest, ConcurrentJoinsAndPollsCloseExactlyOneRound) {
  // Joins race with Poll; every joiner gets exactly one answer and exactly
  // one round closes.
  constexpr int kNodes = 32;
  UseConfig(
      ConfigSpec().Min(kNodes).Max(kNodes).LastCall(absl::ZeroDuration()));
  absl::Mutex mu;
  int answers = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < kNodes; ++i) {
    threads.emplace_back([&, i] {
      rdzv_.Join(
          Request(Node(absl::StrCat("host-", i), absl::StrCat("inc-", i))),
          [&](absl::StatusOr<v1::Assignment> result) {
            EXPECT_TRUE(result.ok()) << result.status();
            absl::MutexLock lock(&mu);
            ++answers;
          });
      rdzv_.Poll();
    });
  }
  for (std::thread& thread : threads) thread.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(answers, kNodes);
  EXPECT_EQ(jobs_.Get(kJob)->round(), 1);
}

}  // namespace
}  // namespace gradsync
