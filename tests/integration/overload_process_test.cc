// Past its heartbeat capacity, the real gradsync-coordinator: 200 members
// heartbeating every 100 ms (2,000/s, each on its own stream, as worker
// processes do) against a coordinator that handles at most 250 heartbeats/s
// (--max_heartbeat_rate: the overload is reached cheaply and the same on
// any machine). With shedding (the default) it slows the members down and
// no live member is LOST; without it (--shed_heartbeats=false), the same
// load makes it declare live members LOST, which is what shows the load is
// past its capacity. And a job whose workers ignore the interval they are
// asked for, or obey it but are past the cap anyway, does not slow failure
// detection in another. Jobs use failure_policy FAIL: one member LOST
// fails the job, so a false loss cannot go unseen.
#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/eventually.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/runtime/health_reporter.h"

namespace gradsync {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testing::CoordinatorProcess;
using testing::Runfile;
using testing::TempPath;

constexpr int kMembers = 200;
constexpr int kConnections = 4;  // the members' streams share them
constexpr absl::Duration kInterval = absl::Milliseconds(100);
// An eighth of the 2,000 heartbeats/s the members send.
constexpr int kCapacity = 250;
// How long overload, shedding and the members hearing of it may take on a
// loaded 2-core machine.
constexpr absl::Duration kBound = absl::Seconds(30);

struct RawMember;
class RawMembers;

class OverloadProcessTest : public ::testing::Test {
 protected:
  void TearDown() override {
    // The coordinator first: with its backlog it would take long to see
    // each stream close; its end ends them all.
    if (started_) {
      EXPECT_TRUE(coordinator_.Stop());
    }
    for (auto& reporter : reporters_) reporter->Stop();
  }

  // Starts the coordinator capped at kCapacity heartbeats/s, with `flags`
  // and a default heartbeat interval of `interval`.
  void StartCoordinator(const std::string& name, std::vector<std::string> flags,
                        absl::Duration interval = kInterval) {
    const std::string metrics_port_file = TempPath("metrics-port-" + name);
    flags.insert(flags.end(),
                 {absl::StrCat("--max_heartbeat_rate=", kCapacity),
                  absl::StrCat("--heartbeat_interval=",
                               absl::FormatDuration(interval)),
                  "--metrics_listen=127.0.0.1:0",
                  "--metrics_port_file=" + metrics_port_file});
    ASSERT_TRUE(coordinator_.Start(Runfile("server/gradsync-coordinator"),
                                   name, flags));
    started_ = true;
    std::ifstream in(metrics_port_file);
    in >> metrics_port_;
    ASSERT_GT(metrics_port_, 0);
    for (int i = 0; i < kConnections; ++i) {
      ClientOptions options;
      options.target = coordinator_.address();
      clients_.push_back(*GrpcCoordinatorClient::Create(options));
    }
  }

  // Joins kMembers processes (one node) to job `job`, which fails when a
  // member is LOST, and starts their heartbeats.
  void StartMembers(const std::string& job) {
    v1::JoinNodeRequest request;
    request.set_job_id(job);
    request.mutable_config()->set_job_id(job);
    request.mutable_config()->set_min_nodes(1);
    request.mutable_config()->set_nproc_per_node(kMembers);
    request.mutable_config()->set_failure_policy(v1::FAILURE_POLICY_FAIL);
    for (int i = 0; i < kMembers; ++i) {
      *request.add_processes()->mutable_node() = LocalNodeDescriptor();
    }
    absl::StatusOr<std::vector<v1::Assignment>> assignments =
        clients_[0]->JoinNode(request);
    ASSERT_TRUE(assignments.ok()) << assignments.status();
    ASSERT_EQ(assignments->size(), static_cast<size_t>(kMembers));
    for (int i = 0; i < kMembers; ++i) {
      CoordinatorClient* client = clients_[i % kConnections].get();
      HealthReporterOptions options;
      options.interval = kInterval;
      options.close_timeout = absl::Milliseconds(100);
      reporters_.push_back(std::make_unique<HealthReporter>(client, options));
      reporters_.back()->Start((*assignments)[i],
                               request.processes(i).node().incarnation_id());
    }
  }

  // Joins `members` processes (one node) to job `job`, heartbeating every
  // `interval`, which fails when a member is LOST. Returns each member's
  // reference.
  std::vector<v1::MemberRef> Join(const std::string& job, int members,
                                  absl::Duration interval) {
    v1::JoinNodeRequest request;
    request.set_job_id(job);
    v1::JobConfig* config = request.mutable_config();
    config->set_job_id(job);
    config->set_min_nodes(1);
    config->set_nproc_per_node(members);
    config->set_failure_policy(v1::FAILURE_POLICY_FAIL);
    *config->mutable_heartbeat_interval() = ToProtoDuration(interval);
    for (int i = 0; i < members; ++i) {
      *request.add_processes()->mutable_node() = LocalNodeDescriptor();
    }
    absl::StatusOr<std::vector<v1::Assignment>> assignments =
        clients_[0]->JoinNode(request);
    EXPECT_TRUE(assignments.ok()) << assignments.status();
    std::vector<v1::MemberRef> refs;
    for (size_t i = 0; assignments.ok() && i < assignments->size(); ++i) {
      v1::MemberRef& ref = refs.emplace_back();
      ref.set_job_id((*assignments)[i].job_id());
      ref.set_round((*assignments)[i].round());
      ref.set_rank((*assignments)[i].rank());
      ref.set_incarnation_id(request.processes(i).node().incarnation_id());
    }
    return refs;
  }

  absl::StatusOr<v1::JobStatus> Job(const std::string& job) {
    return clients_[0]->GetJob(job);
  }

  // A sample of the coordinator's metrics without labels; -1 if absent.
  double Metric(const std::string& name) {
    httplib::Client http("127.0.0.1", metrics_port_);
    httplib::Result response = http.Get("/metrics");
    if (!response || response->status != 200) return -1;
    for (absl::string_view line :
         absl::StrSplit(response->body, '\n', absl::SkipEmpty())) {
      double value = 0;
      if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, " ") &&
          absl::SimpleAtod(line, &value)) {
        return value;
      }
    }
    return -1;
  }

  // Adds `refs` to `members`, over the connections in turn, each sending
  // every `every` (and, unless `ignore_answers`, every interval answered).
  void AddMembers(RawMembers* members, const std::vector<v1::MemberRef>& refs,
                  absl::Duration every, bool ignore_answers);
  // Hangs `hung` of job "witness" (it stops sending; its stream stays
  // open) and returns how long until the job FAILED.
  absl::Duration HangUntilWitnessFails(RawMember* hung);
  // The witness failed for a member that missed 3 heartbeats `every`
  // interval, and job "flood" still runs (none of it was lost).
  void ExpectWitnessMissedAndFloodRunning(absl::Duration every);

  CoordinatorProcess coordinator_;
  bool started_ = false;
  int metrics_port_ = 0;
  std::vector<std::unique_ptr<CoordinatorClient>> clients_;
  std::vector<std::unique_ptr<HealthReporter>> reporters_;
};

TEST_F(OverloadProcessTest, WithoutSheddingLiveMembersAreLost) {
  StartCoordinator("unshed", {"--shed_heartbeats=false"});
  StartMembers("unshed");
  // Every member heartbeats, yet past capacity some are found LOST.
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::JobStatus> job = Job("unshed");
        return job.ok() && job->state() == v1::JOB_STATE_FAILED;
      },
      kBound));
  absl::StatusOr<v1::JobStatus> job = Job("unshed");
  ASSERT_TRUE(job.ok()) << job.status();
  // Lost after heartbeats were handled, or before the first one was (its
  // turn under the cap came too late): either way a live member.
  EXPECT_THAT(job->reason(), AnyOf(HasSubstr("lost: missed 3 heartbeats"),
                                   HasSubstr("lost: sent no heartbeat")));
  EXPECT_EQ(Metric("gradsync_heartbeat_shed_periods_total"), 0);
}

TEST_F(OverloadProcessTest, PastCapacityNoLiveMemberIsLost) {
  StartCoordinator("shed", {});
  StartMembers("shed");
  // The coordinator sheds, and every member sends at the interval it asks.
  int factor = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        factor = static_cast<int>(Metric("gradsync_heartbeat_interval_factor"));
        if (factor <= 1) return false;
        for (const auto& reporter : reporters_) {
          if (reporter->interval() != kInterval * factor) return false;
        }
        return true;
      },
      kBound))
      << "factor " << factor;
  // 2,000/s fits 70% of 250/s at 16 x 100 ms.
  EXPECT_EQ(factor, 16);
  EXPECT_EQ(Metric("gradsync_heartbeat_overloaded"), 1);
  EXPECT_EQ(Metric("gradsync_heartbeat_interval_seconds"),
            absl::ToDoubleSeconds(kInterval * factor));
  EXPECT_GE(Metric("gradsync_heartbeat_shed_periods_total"), 1);

  // Then every member is heard from twice more on average.
  const double heartbeats = Metric("gradsync_heartbeats_total");
  ASSERT_TRUE(Eventually(
      [&] { return Metric("gradsync_heartbeats_total") >= heartbeats + 2 * kMembers; },
      kBound));
  absl::StatusOr<v1::JobStatus> job = Job("shed");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING) << job->reason();
  ASSERT_EQ(job->members_size(), kMembers);
  for (const v1::Member& m : job->members()) {
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_ACTIVE)
        << "rank " << m.rank() << ": " << m.state_reason();
  }
  EXPECT_THAT(job->diagnosis().overload(),
              HasSubstr("the coordinator is past its heartbeat capacity and "
                        "sheds load"));
  EXPECT_THAT(job->diagnosis().overload(),
              HasSubstr(absl::StrCat("every ",
                                     absl::FormatDuration(kInterval * factor))));
}

// A member's heartbeats on a raw stream, sent by RawMembers' thread.
struct RawMember {
  v1::MemberRef ref;
  std::unique_ptr<HeartbeatStream> stream;
  // Every this long; ignore_answers keeps it, otherwise each answer's
  // interval replaces it (as a HealthReporter obeys).
  std::atomic<int64_t> every_ns{0};
  bool ignore_answers = false;
  std::atomic<bool> sending{true};
  absl::Time next = absl::InfinitePast();
};

// Sends every RawMember's heartbeats from one thread, until destroyed.
class RawMembers {
 public:
  void Add(CoordinatorClient* client, const v1::MemberRef& ref,
           absl::Duration every, bool ignore_answers) {
    auto member = std::make_unique<RawMember>();
    RawMember* m = member.get();
    m->ref = ref;
    m->every_ns = absl::ToInt64Nanoseconds(every);
    m->ignore_answers = ignore_answers;
    m->stream = client->OpenHeartbeatStream(
        [m](const v1::HeartbeatResponse& answer) {
          const absl::Duration asked =
              FromProtoDuration(answer.heartbeat_interval());
          if (!m->ignore_answers && asked > absl::ZeroDuration()) {
            m->every_ns = absl::ToInt64Nanoseconds(asked);
          }
        });
    members_.push_back(std::move(member));
  }
  void Start() {
    thread_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(2))) {
        const absl::Time now = absl::Now();
        for (auto& m : members_) {
          if (!m->sending || now < m->next) continue;
          v1::HeartbeatRequest heartbeat;
          *heartbeat.mutable_member() = m->ref;
          heartbeat.mutable_metrics()->set_state(v1::WORKER_STATE_TRAINING);
          m->stream->Send(std::move(heartbeat));
          m->next = now + absl::Nanoseconds(m->every_ns.load());
        }
      }
    });
  }
  RawMember& member(int i) { return *members_[i]; }
  ~RawMembers() {
    stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::vector<std::unique_ptr<RawMember>> members_;
  absl::Notification stop_;
  std::thread thread_;
};

void OverloadProcessTest::AddMembers(RawMembers* members,
                                     const std::vector<v1::MemberRef>& refs,
                                     absl::Duration every,
                                     bool ignore_answers) {
  for (size_t i = 0; i < refs.size(); ++i) {
    members->Add(clients_[i % kConnections].get(), refs[i], every,
                 ignore_answers);
  }
}

absl::Duration OverloadProcessTest::HangUntilWitnessFails(RawMember* hung) {
  hung->sending = false;
  const absl::Time stopped = absl::Now();
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::JobStatus> job = Job("witness");
        return job.ok() && job->state() == v1::JOB_STATE_FAILED;
      },
      kBound));
  return absl::Now() - stopped;
}

void OverloadProcessTest::ExpectWitnessMissedAndFloodRunning(
    absl::Duration every) {
  absl::StatusOr<v1::JobStatus> job = Job("witness");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->reason(),
              HasSubstr(absl::StrCat("missed 3 heartbeats (every ",
                                     absl::FormatDuration(every), ")")));
  job = Job("flood");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING) << job->reason();
}

// A job of 200 members asked for a heartbeat every 5 s that send one every
// 20 ms (10,000 a second against the coordinator's 250), beside a job of 3
// that obeys its 200 ms. The coordinator reads the first job's streams no
// faster than twice what it asked (HeartbeatPolicer: 80 heartbeats a
// second in all, after a burst of 8 a member),
// so once the start's backlog is read it is not behind, and the small job's
// hung member is found LOST about as fast as on an idle coordinator
// (3 x 200 ms), not after the allowance that stretches every job's
// deadlines while the coordinator is behind (up to 16 x that: without the
// policer, a message of each of the 200 streams always waits its turn, 800
// ms, over the 500 ms that makes a queue delay an overload). The
// coordinator's default interval is 1 s, so that its own queue delays on a
// loaded machine neither begin an episode of being behind (over 500 ms)
// nor keep one going (calm at 125 ms). Nobody of the flooding job is lost
// for being held back either.
TEST_F(OverloadProcessTest, AJobIgnoringItsIntervalDoesNotSlowDetectionInAnother) {
  constexpr absl::Duration kWitnessInterval = absl::Milliseconds(200);
  StartCoordinator("hostile", {}, absl::Seconds(1));
  const std::vector<v1::MemberRef> flood = Join("flood", 200, absl::Seconds(5));
  const std::vector<v1::MemberRef> witness =
      Join("witness", 3, kWitnessInterval);
  ASSERT_EQ(flood.size(), 200u);
  ASSERT_EQ(witness.size(), 3u);
  RawMembers members;
  AddMembers(&members, flood, absl::Milliseconds(20), /*ignore_answers=*/true);
  AddMembers(&members, witness, kWitnessInterval, /*ignore_answers=*/false);
  members.Start();
  // The flood is read: every stream's first messages, then what the
  // coordinator asked for.
  ASSERT_TRUE(Eventually(
      [&] { return Metric("gradsync_heartbeats_total") >= 3 * 200; }, kBound));
  EXPECT_TRUE(Eventually(
      [&] { return Metric("gradsync_heartbeat_behind") == 0; }, kBound))
      << "still behind with the flood held back";

  RawMember& hung = members.member(static_cast<int>(flood.size()) + 1);
  EXPECT_EQ(absl::Nanoseconds(hung.every_ns.load()), kWitnessInterval)
      << "the small job keeps its own interval";
  const absl::Duration detection = HangUntilWitnessFails(&hung);
  // Alone: 600 ms, and this loaded machine's share; behind the flood
  // without holding it back: 600 ms plus up to 9.6 s.
  EXPECT_LT(detection, absl::Seconds(3)) << "found after " << detection;
  ExpectWitnessMissedAndFloodRunning(kWitnessInterval);
}

// Under the cap, heartbeats are handled fairly across jobs (HeartbeatPacer).
// A job of 200 members that obey their interval (100 ms) is past the cap
// even at the largest slowdown allowed here (4x: 500 heartbeats a second
// against 250), so the coordinator stays behind and every job's deadlines
// may be stretched (the allowance, up to 4 x the witness's 1.5 s window).
// A job of 3 at 500 ms beside it gets its turns at once, its heartbeats
// keep time, and it is allowed only what its own wait for turns grew by:
// its hung member is found about as fast as on an idle coordinator (1.5 s
// after its last heartbeat). With one line of turns for every job, each of
// its heartbeats waited behind the flood's (200 x 4 ms), so they were read
// over 750 ms apart (late), and it was allowed the time behind too: found
// after 8 s.
TEST_F(OverloadProcessTest, AnObedientFloodPastTheCapDoesNotSlowDetectionInAnother) {
  constexpr absl::Duration kWitnessInterval = absl::Milliseconds(500);
  StartCoordinator("fair", {"--max_heartbeat_slowdown=4"}, absl::Seconds(1));
  const std::vector<v1::MemberRef> flood = Join("flood", 200, kInterval);
  const std::vector<v1::MemberRef> witness =
      Join("witness", 3, kWitnessInterval);
  ASSERT_EQ(flood.size(), 200u);
  ASSERT_EQ(witness.size(), 3u);
  RawMembers members;
  AddMembers(&members, flood, kInterval, /*ignore_answers=*/false);
  AddMembers(&members, witness, kWitnessInterval, /*ignore_answers=*/false);
  members.Start();
  // The flood is slowed as far as allowed, and the coordinator is behind.
  ASSERT_TRUE(Eventually(
      [&] {
        return Metric("gradsync_heartbeat_interval_factor") == 4 &&
               Metric("gradsync_heartbeat_behind") == 1;
      },
      kBound));
  RawMember& hung = members.member(static_cast<int>(flood.size()) + 1);
  ASSERT_EQ(absl::Nanoseconds(hung.every_ns.load()), kWitnessInterval)
      << "the small job keeps its own interval";
  const absl::Duration detection = HangUntilWitnessFails(&hung);
  EXPECT_EQ(Metric("gradsync_heartbeat_behind"), 1)
      << "the coordinator was behind throughout";
  EXPECT_LT(detection, absl::Seconds(4)) << "found after " << detection;
  ExpectWitnessMissedAndFloodRunning(kWitnessInterval);
}

}  // namespace
}  // namespace gradsync
