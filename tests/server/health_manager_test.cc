#include "server/health_manager.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/health.pb.h"
#include "server/job_manager.h"
#include "server/storage/in_memory_storage.h"

namespace gradsync {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;

constexpr char kJob[] = "train";

std::string Incarnation(int rank) { return absl::StrCat("inc-", rank); }

// Metrics of a rank at `step`, whose latest step took `step_time`, with
// its collective counters (defined with the diagnosis tests).
v1::WorkerMetrics Stepping(int64_t step, absl::Duration step_time,
                           int64_t started, int64_t finished);

// A JobManager with one running round of `world` members (round 1) and a
// HealthManager over it, on a FakeClock.
class HealthManagerTest : public ::testing::Test {
 protected:
  void StartJob(int world, v1::FailurePolicy policy = v1::FAILURE_POLICY_DEGRADE,
                absl::Duration interval = absl::ZeroDuration()) {
    world_ = world;
    v1::JobConfig config;
    config.set_job_id(kJob);
    config.set_min_nodes(world);
    config.set_failure_policy(policy);
    config.set_divergence_policy(divergence_policy_);
    config.set_straggler_policy(straggler_policy_);
    if (interval > absl::ZeroDuration()) {
      *config.mutable_heartbeat_interval() = ToProtoDuration(interval);
    }
    ASSERT_TRUE(jobs_.Create(config).ok());
    CloseRound(1);
  }

  void CloseRound(int64_t round) {
    std::vector<v1::Member> members(world_);
    for (int r = 0; r < world_; ++r) {
      members[r].set_rank(r);
      members[r].mutable_node()->set_hostname(absl::StrCat("host-", r));
      members[r].mutable_node()->set_incarnation_id(Incarnation(r));
      members[r].set_state(v1::MEMBER_STATE_ACTIVE);
    }
    ASSERT_TRUE(jobs_.RecordRoundClosed(kJob, round, v1::BACKEND_GLOO,
                                        std::move(members))
                    .ok());
  }

  // What the rendezvous does when it supersedes round `round`: records it,
  // then tells this manager (RoundEnded).
  void Supersede(int64_t round, const std::string& reason) {
    ASSERT_TRUE(jobs_.RecordRoundSuperseded(kJob, reason).ok());
    health_.RoundEnded(kJob, round);
  }

  static v1::MemberRef Ref(int rank, int64_t round = 1) {
    v1::MemberRef ref;
    ref.set_job_id(kJob);
    ref.set_round(round);
    ref.set_rank(rank);
    ref.set_incarnation_id(Incarnation(rank));
    return ref;
  }

  // One heartbeat of `rank` on its own stream; returns whether the
  // coordinator answered (response in last_response_).
  absl::StatusOr<bool> Beat(int rank, v1::WorkerMetrics metrics = {},
                            int64_t round = 1) {
    std::unique_ptr<HealthManager::Session>& session = sessions_[rank];
    if (session == nullptr) session = HealthManager::NewSession();
    v1::HeartbeatRequest request;
    *request.mutable_member() = Ref(rank, round);
    *request.mutable_metrics() = std::move(metrics);
    last_response_.Clear();
    return health_.Heartbeat(session.get(), &request, &last_response_);
  }

  void BeatAll(v1::WorkerMetrics metrics = {}) {
    for (int r = 0; r < world_; ++r) ASSERT_TRUE(Beat(r, metrics).ok());
  }

  // Steps 1..`steps` of 50 ms, 50 ms apart: every rank reports each, its
  // collectives up to the step's finished (Stepping).
  void StepAll50ms(int steps) {
    for (int step = 1; step <= steps; ++step) {
      for (int r = 0; r < world_; ++r) {
        ASSERT_TRUE(
            Beat(r, Stepping(step, absl::Milliseconds(50), step, step)).ok());
      }
      Advance(absl::Milliseconds(50));
    }
  }

  absl::StatusOr<v1::JobState> Complete(int rank, bool success, int exit_code,
                                        const std::string& message) {
    v1::ReportCompletionRequest request;
    *request.mutable_member() = Ref(rank);
    request.set_success(success);
    request.set_exit_code(exit_code);
    request.set_message(message);
    return health_.ReportCompletion(request);
  }

  v1::JobStatus Status(const std::string& job = kJob) {
    absl::StatusOr<v1::JobStatus> status = jobs_.Get(job);
    EXPECT_TRUE(status.ok()) << status.status();
    health_.Describe(&*status);
    return *status;
  }

  // Steps the clock by `d` and runs detection.
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    health_.Poll();
  }

  FakeClock clock_;
  InMemoryStorage storage_;
  JobManager jobs_{&storage_, &clock_};
  // What the manager reported to its loss callback.
  std::vector<HealthManager::Loss> losses_;
  // What it reported to its job-ended callback: "<state>: <reason>".
  std::vector<std::string> ended_;
  HealthManager health_{&jobs_, &clock_, HealthConfig(),
                        [this](const HealthManager::Loss& loss) {
                          losses_.push_back(loss);
                        },
                        [this](const std::string& job_id, v1::JobState state,
                               const std::string& reason) {
                          EXPECT_EQ(job_id, kJob);
                          ended_.push_back(absl::StrCat(
                              JobStateName(state), ": ", reason));
                        },
                        [this](const HealthManager::Heal& heal) {
                          heals_.push_back(heal);
                        },
                        [this](const HealthManager::Rebalance& r) {
                          rebalances_.push_back(r);
                        }};
  // What it reported to its rebalance callback.
  std::vector<HealthManager::Rebalance> rebalances_;
  v1::StragglerPolicy straggler_policy_ = v1::STRAGGLER_POLICY_UNSPECIFIED;
  // What it reported to its heal callback.
  std::vector<HealthManager::Heal> heals_;
  // The divergence policy StartJob gives the job.
  v1::DivergencePolicy divergence_policy_ = v1::DIVERGENCE_POLICY_UNSPECIFIED;
  int world_ = 0;
  std::map<int, std::unique_ptr<HealthManager::Session>> sessions_;
  v1::HeartbeatResponse last_response_;
};

// ---------------------------------------------------------------------------
// Liveness and the state machine


TEST_F(HealthManagerTest, MemberSilentForThreeIntervalsIsLostAndJobDegraded) {
  StartJob(2);
  BeatAll();
  // Rank 0 keeps beating; rank 1 goes silent.
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Seconds(1));
    ASSERT_TRUE(Beat(0).ok());
  }
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING) << "3 s is the bound";
  Advance(absl::Milliseconds(10));
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_DEGRADED);
  EXPECT_THAT(status.reason(), HasSubstr("rank 1 (host-1) lost: missed 3 "
                                         "heartbeats (every 1s)"));
  EXPECT_THAT(status.reason(), HasSubstr("must rejoin to form round 2"));
  EXPECT_EQ(status.members(0).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(status.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_THAT(status.members(1).state_reason(), HasSubstr("last heard 3.01s ago"));
}

TEST_F(HealthManagerTest, FailPolicyFailsTheJobWhenAMemberIsLost) {
  StartJob(2, v1::FAILURE_POLICY_FAIL);
  BeatAll();
  Advance(absl::Seconds(3) + absl::Milliseconds(1));
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.reason(), HasSubstr("rank 0 (host-0) lost"));
  EXPECT_THAT(status.reason(), HasSubstr("and 1 more rank(s)"));
  EXPECT_TRUE(status.has_end_time());
}

TEST_F(HealthManagerTest, PerJobIntervalOverridesTheDefault) {
  StartJob(1, v1::FAILURE_POLICY_DEGRADE, absl::Seconds(10));
  ASSERT_TRUE(Beat(0).ok());
  EXPECT_EQ(FromProtoDuration(last_response_.heartbeat_interval()),
            absl::Seconds(10));
  Advance(absl::Seconds(29));
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  Advance(absl::Seconds(2));
  EXPECT_EQ(Status().state(), v1::JOB_STATE_DEGRADED);
}

TEST_F(HealthManagerTest, BrokenStreamIsLostWhenItDoesNotReconnectInTheGrace) {
  StartJob(2);
  BeatAll();
  health_.StreamBroken(sessions_[1].get());
  // The grace is the missed-heartbeat window (3 x 1 s); rank 0 beats on.
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Seconds(1));
    ASSERT_TRUE(Beat(0).ok());
  }
  EXPECT_EQ(Status().members(1).state(), v1::MEMBER_STATE_ACTIVE);
  Advance(absl::Milliseconds(10));
  v1::JobStatus status = Status();
  EXPECT_EQ(status.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_THAT(status.members(1).state_reason(),
              HasSubstr("heartbeat stream broke (process killed or connection "
                        "lost) and it did not heartbeat again within 3s"));
  EXPECT_EQ(status.state(), v1::JOB_STATE_DEGRADED);
}

TEST_F(HealthManagerTest, AMemberThatReconnectsWithinTheGraceKeepsItsPlace) {
  StartJob(2, v1::FAILURE_POLICY_RECOVER);
  BeatAll();
  health_.StreamBroken(sessions_[1].get());
  Advance(absl::Seconds(1));
  ASSERT_TRUE(Beat(0).ok());
  Advance(absl::Seconds(1));
  sessions_[1] = HealthManager::NewSession();  // the worker reconnected
  ASSERT_TRUE(Beat(1).ok());
  for (int i = 0; i < 10; ++i) {
    Advance(absl::Seconds(1));
    BeatAll();
  }
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.members(1).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_THAT(losses_, IsEmpty());
  // Its new stream has a grace of its own.
  health_.StreamBroken(sessions_[1].get());
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Beat(0).ok());
  Advance(absl::Seconds(1) + absl::Milliseconds(10));
  EXPECT_EQ(Status().members(1).state(), v1::MEMBER_STATE_LOST);
  ASSERT_EQ(losses_.size(), 1u);
  EXPECT_EQ(losses_[0].rank, 1);
}

TEST_F(HealthManagerTest, AnOldStreamBreakingAfterANewOneBeatChangesNothing) {
  StartJob(2);
  BeatAll();
  // The worker saw its stream fail first and heartbeats on a new one; the
  // coordinator notices the old one's end only later.
  std::unique_ptr<HealthManager::Session> old = std::move(sessions_[1]);
  ASSERT_TRUE(Beat(1).ok());
  health_.StreamBroken(old.get());
  for (int i = 0; i < 10; ++i) {
    Advance(absl::Seconds(1));
    BeatAll();
  }
  EXPECT_EQ(Status().members(1).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(HealthManagerTest, WithoutAGraceABrokenStreamIsLostAtOnce) {
  StartJob(2, v1::FAILURE_POLICY_RECOVER);
  HealthConfig config;
  config.reconnect_grace = absl::ZeroDuration();
  std::vector<HealthManager::Loss> losses;
  HealthManager health(&jobs_, &clock_, config,
                       [&](const HealthManager::Loss& l) { losses.push_back(l); });
  std::unique_ptr<HealthManager::Session> session = HealthManager::NewSession();
  v1::HeartbeatRequest request;
  *request.mutable_member() = Ref(1);
  v1::HeartbeatResponse response;
  ASSERT_TRUE(health.Heartbeat(session.get(), &request, &response).ok());
  health.StreamBroken(session.get());
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_EQ(losses[0].detection, absl::ZeroDuration());
  EXPECT_THAT(losses[0].reason,
              HasSubstr("rank 1 (host-1) lost: heartbeat stream broke"));
}

TEST_F(HealthManagerTest, LossesUnderRecoverAreReportedToTheCallback) {
  StartJob(3, v1::FAILURE_POLICY_RECOVER);
  BeatAll();
  health_.StreamBroken(sessions_[1].get());
  EXPECT_THAT(losses_, IsEmpty()) << "in its reconnect grace";
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Beat(0).ok());
  ASSERT_TRUE(Beat(2).ok());
  Advance(absl::Seconds(1) + absl::Milliseconds(10));
  ASSERT_EQ(losses_.size(), 1u);
  EXPECT_EQ(losses_[0].job_id, kJob);
  EXPECT_EQ(losses_[0].round, 1);
  EXPECT_EQ(losses_[0].rank, 1);
  EXPECT_THAT(losses_[0].reason,
              HasSubstr("rank 1 (host-1) lost: heartbeat stream broke"));
  EXPECT_EQ(losses_[0].detection, absl::Seconds(3) + absl::Milliseconds(10))
      << "silent since its last heartbeat";
  // A silent member is reported once, when it is found lost.
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Seconds(1));
    ASSERT_TRUE(Beat(0).ok());
  }
  ASSERT_EQ(losses_.size(), 2u);
  EXPECT_EQ(losses_[1].rank, 2);
  EXPECT_THAT(losses_[1].reason, HasSubstr("missed 3 heartbeats"));
  Advance(absl::Seconds(5));
  EXPECT_EQ(losses_.size(), 3u) << "rank 0 went silent too";
}

TEST_F(HealthManagerTest, EndedJobsAreReportedOnce) {
  StartJob(2);
  BeatAll();
  ASSERT_TRUE(Complete(0, true, 0, "").ok());
  EXPECT_TRUE(ended_.empty());
  ASSERT_TRUE(Complete(1, true, 0, "").ok());
  ASSERT_TRUE(Complete(1, true, 0, "").ok());  // a repeat
  EXPECT_THAT(ended_, ::testing::ElementsAre(
                          "succeeded: all 2 member(s) of round 1 succeeded"));
}

TEST_F(HealthManagerTest, FailPolicyReportsNoLoss) {
  StartJob(2, v1::FAILURE_POLICY_FAIL);
  BeatAll();
  health_.StreamBroken(sessions_[1].get());
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Beat(0).ok());
  Advance(absl::Seconds(1) + absl::Milliseconds(10));
  EXPECT_EQ(Status().state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(losses_, IsEmpty());
  ASSERT_EQ(ended_.size(), 1u);
  EXPECT_THAT(ended_[0], HasSubstr("failed: rank 1 (host-1) lost"));
}

TEST_F(HealthManagerTest, AMemberInItsGraceWhenTheJobFailsIsLost) {
  StartJob(2, v1::FAILURE_POLICY_FAIL);
  BeatAll();
  // Rank 1 was killed; rank 0's collective with it failed and it exits.
  health_.StreamBroken(sessions_[1].get());
  ASSERT_TRUE(Complete(0, false, 1, "gloo allreduce: connection reset").ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.reason(),
              HasSubstr("rank 0 (host-0) failed with exit code 1: gloo "
                        "allreduce: connection reset (the heartbeat stream of "
                        "rank(s) 1 had broken before)"));
  EXPECT_EQ(status.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_THAT(status.members(1).state_reason(),
              HasSubstr("and the job ended before it heartbeat again"));
}

// Every member's state is final once the job fails: members still active
// are EXITED "stopped: the job failed"; a report that comes later changes
// nothing.
TEST_F(HealthManagerTest, MembersStillActiveWhenTheJobFailsAreStopped) {
  StartJob(3, v1::FAILURE_POLICY_FAIL);
  BeatAll();
  ASSERT_TRUE(Complete(1, true, 0, "").ok());
  ASSERT_TRUE(Complete(0, false, 137, "exited with code 137 (SIGKILL)").ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(status.members(0).state(), v1::MEMBER_STATE_EXITED);
  EXPECT_THAT(status.members(0).state_reason(), HasSubstr("code 137"));
  EXPECT_EQ(status.members(1).state_reason(), "succeeded");
  EXPECT_EQ(status.members(2).state(), v1::MEMBER_STATE_EXITED);
  EXPECT_EQ(status.members(2).state_reason(), "stopped: the job failed");
  (void)Complete(2, false, 1, "its peer died");
  EXPECT_EQ(Status().members(2).state_reason(), "stopped: the job failed");
  // It said how it ended: its stream breaking then loses nothing.
  health_.StreamBroken(sessions_[2].get());
  EXPECT_EQ(Status().members(2).state(), v1::MEMBER_STATE_EXITED);
}

// Rank 1 was killed; rank 0 saw it exit and failed the job before the
// coordinator saw rank 1's stream break. The member taken for stopped was
// lost, and its record says so; the job's end stays as it was.
TEST_F(HealthManagerTest, AMemberTakenForStoppedWhoseStreamBreaksIsLost) {
  StartJob(3, v1::FAILURE_POLICY_FAIL);
  BeatAll();
  ASSERT_TRUE(
      Complete(0, false, 1, "shm allreduce: rank 1 (pid 42) exited").ok());
  const v1::JobStatus failed = Status();
  ASSERT_EQ(failed.members(1).state_reason(), "stopped: the job failed");
  clock_.Advance(absl::Seconds(1));
  health_.StreamBroken(sessions_[1].get());
  health_.StreamBroken(sessions_[1].get());  // once is enough
  Advance(absl::Minutes(1));
  v1::JobStatus status = Status();
  EXPECT_EQ(status.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(status.members(1).state_reason(),
            "heartbeat stream broke (process killed or connection lost) (seen "
            "after the job failed)");
  EXPECT_EQ(status.members(2).state_reason(), "stopped: the job failed")
      << "its stream did not break";
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(status.reason(), failed.reason());
  EXPECT_EQ(FromProtoTime(status.end_time()), FromProtoTime(failed.end_time()));
  EXPECT_THAT(ended_, ::testing::SizeIs(1));
  EXPECT_THAT(losses_, IsEmpty()) << "no round is left to re-form";
}

// A connection reset while a member taken for stopped was stopping: it is
// recorded LOST, then its own report says how it ended.
TEST_F(HealthManagerTest, AMemberLostAfterTheEndThatReportsIsNotLost) {
  StartJob(2, v1::FAILURE_POLICY_FAIL);
  BeatAll();
  ASSERT_TRUE(Complete(0, false, 1, "out of memory").ok());
  health_.StreamBroken(sessions_[1].get());
  ASSERT_EQ(Status().members(1).state(), v1::MEMBER_STATE_LOST);
  ASSERT_TRUE(Complete(1, false, 1, "stopped: its peer failed").ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.members(1).state(), v1::MEMBER_STATE_EXITED);
  EXPECT_EQ(status.members(1).state_reason(),
            "failed with exit code 1: stopped: its peer failed");
  EXPECT_THAT(status.reason(), HasSubstr("out of memory"));
}

// A node agent heartbeats for the process it started: status shows that
// process's pid, not the agent's that joined.
TEST_F(HealthManagerTest, TheProcessesOwnPidIsShown) {
  StartJob(2, v1::FAILURE_POLICY_RECOVER);
  const int64_t agent = Status().members(0).node().pid();
  v1::WorkerMetrics metrics;
  metrics.set_pid(agent + 1000);
  ASSERT_TRUE(Beat(0, metrics).ok());
  ASSERT_TRUE(Beat(1).ok());
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.members(0).node().pid(), agent + 1000);
  EXPECT_EQ(status.members(1).node().pid(), jobs_.Get(kJob)->members(1).node().pid())
      << "no pid in its metrics: the one that joined";
  metrics.set_pid(-1);
  EXPECT_EQ(Beat(0, metrics).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HealthManagerTest, StreamBreakingAfterTheRoundWasSupersededIsReported) {
  StartJob(2, v1::FAILURE_POLICY_RECOVER);
  BeatAll();
  // Rank 0 rejoined first (its collective failed): the round is superseded
  // before the coordinator saw rank 1's stream break.
  Supersede(1, "rank 0 rejoined");
  Advance(absl::Milliseconds(10));
  health_.StreamBroken(sessions_[1].get());
  ASSERT_EQ(losses_.size(), 1u);
  EXPECT_EQ(losses_[0].rank, 1);
  EXPECT_EQ(losses_[0].round, 1);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING) << "nothing recorded";
}

TEST_F(HealthManagerTest, SupersedingReportsMembersInTheirGraceAtOnce) {
  StartJob(3, v1::FAILURE_POLICY_RECOVER);
  BeatAll();
  // Rank 1 was killed: its stream broke, then the survivors' collective
  // failed and they rejoined.
  health_.StreamBroken(sessions_[1].get());
  Advance(absl::Milliseconds(10));
  EXPECT_THAT(losses_, IsEmpty());
  Supersede(1, "rank 0 rejoined");
  Advance(absl::Milliseconds(10));
  ASSERT_EQ(losses_.size(), 1u);
  EXPECT_EQ(losses_[0].rank, 1);
  EXPECT_EQ(losses_[0].round, 1);
  EXPECT_EQ(losses_[0].detection, absl::ZeroDuration());
  EXPECT_THAT(losses_[0].reason,
              HasSubstr("rank 1 (host-1) lost: heartbeat stream broke"));
  Advance(absl::Seconds(10));
  EXPECT_EQ(losses_.size(), 1u) << "reported once";
}

TEST_F(HealthManagerTest, BrokenStreamsDuringShutdownMarkNothing) {
  StartJob(2);
  BeatAll();
  health_.StopDetection();
  health_.StreamBroken(sessions_[1].get());
  EXPECT_EQ(Status().members(1).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(HealthManagerTest, JobsWithoutHeartbeatsAreNeverMarkedLost) {
  StartJob(2);
  Advance(absl::Hours(1));
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.members(0).state(), v1::MEMBER_STATE_ACTIVE);
}

TEST_F(HealthManagerTest, MemberThatNeverBeatsIsLostOnceTheRoundIsMonitored) {
  StartJob(2);
  ASSERT_TRUE(Beat(0).ok());
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Beat(0).ok());
  Advance(absl::Seconds(1) + absl::Milliseconds(1));
  v1::JobStatus status = Status();
  EXPECT_EQ(status.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_THAT(status.members(1).state_reason(),
              HasSubstr("sent no heartbeat in the 3.001s since monitoring"));
}

TEST_F(HealthManagerTest, AnsweringFirstHeartbeatAndStateChangesOnly) {
  StartJob(2);
  absl::StatusOr<bool> first = Beat(0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  EXPECT_EQ(last_response_.job_state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(FromProtoDuration(last_response_.heartbeat_interval()),
            absl::Seconds(1));
  EXPECT_FALSE(*Beat(0));
  ASSERT_TRUE(Beat(1).ok());
  health_.StreamBroken(sessions_[1].get());
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Seconds(1));
    EXPECT_FALSE(*Beat(0)) << "nothing changed in the grace";
  }
  Advance(absl::Milliseconds(10));
  absl::StatusOr<bool> after = Beat(0);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(*after);
  EXPECT_EQ(last_response_.job_state(), v1::JOB_STATE_DEGRADED);
  EXPECT_THAT(last_response_.reason(), HasSubstr("rank 1"));
}

TEST_F(HealthManagerTest, SupersededRoundEndsMonitoringWithoutLosses) {
  StartJob(2);
  BeatAll();
  Supersede(1, "rank 0 rejoined");
  Advance(absl::Seconds(10));
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(status.members(0).state(), v1::MEMBER_STATE_ACTIVE);
  absl::StatusOr<bool> stale = Beat(0);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.status().message(), HasSubstr("rejoin"));

  // The next round is monitored afresh.
  CloseRound(2);
  sessions_.clear();
  absl::StatusOr<bool> fresh = Beat(0, {}, /*round=*/2);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(Beat(1, {}, /*round=*/1).status().code(),
            absl::StatusCode::kAborted);
}

// ---------------------------------------------------------------------------
// Completion and retention

TEST_F(HealthManagerTest, JobSucceedsWhenEveryMemberSucceeds) {
  StartJob(2);
  BeatAll();
  absl::StatusOr<v1::JobState> one = Complete(0, true, 0, "");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, v1::JOB_STATE_RUNNING);
  EXPECT_EQ(*Complete(0, true, 0, ""), v1::JOB_STATE_RUNNING) << "idempotent";
  // An exited member is not LOST when it stops beating.
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Beat(1).ok());
  Advance(absl::Seconds(2));
  EXPECT_EQ(Status().members(0).state(), v1::MEMBER_STATE_EXITED);
  EXPECT_EQ(*Complete(1, true, 0, ""), v1::JOB_STATE_SUCCEEDED);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(status.reason(), "all 2 member(s) of round 1 succeeded");
  EXPECT_EQ(status.members(1).state_reason(), "succeeded");
  EXPECT_EQ(FromProtoTime(status.end_time()), clock_.Now());
  // An ended job takes no more joins.
  v1::JobConfig config;
  config.set_job_id(kJob);
  absl::StatusOr<v1::JobConfig> join = jobs_.GetOrCreate(kJob, nullptr);
  EXPECT_EQ(join.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(join.status().message(), HasSubstr("has ended (succeeded"));
}

TEST_F(HealthManagerTest, AFailedMemberFailsTheJobWithItsExitCodeAndMessage) {
  StartJob(3);
  EXPECT_EQ(*Complete(2, false, 3, "CUDA out of memory at step 1200"),
            v1::JOB_STATE_FAILED);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.reason(),
            "rank 2 (host-2) failed with exit code 3: CUDA out of memory at "
            "step 1200");
  EXPECT_EQ(status.members(2).state(), v1::MEMBER_STATE_EXITED);
  // Failed jobs are not monitored for liveness any more: the others,
  // stopped when the job failed, are not found LOST later.
  Advance(absl::Minutes(1));
  EXPECT_EQ(Status().members(0).state(), v1::MEMBER_STATE_EXITED);
  EXPECT_EQ(Status().members(0).state_reason(), "stopped: the job failed");
}

TEST_F(HealthManagerTest, EndedJobsAreForgottenAfterRetention) {
  StartJob(1);
  ASSERT_TRUE(Complete(0, true, 0, "").ok());
  clock_.Advance(absl::Minutes(30));
  EXPECT_THAT(jobs_.EndedBefore(clock_.Now() - absl::Hours(1)), IsEmpty());
  EXPECT_FALSE(jobs_.ForgetIfEndedBefore(kJob, clock_.Now() - absl::Hours(1)));
  clock_.Advance(absl::Minutes(31));
  EXPECT_EQ(jobs_.EndedBefore(clock_.Now() - absl::Hours(1)),
            std::vector<std::string>{kJob});
  health_.Forget(kJob);
  EXPECT_TRUE(jobs_.ForgetIfEndedBefore(kJob, clock_.Now() - absl::Hours(1)));
  EXPECT_EQ(jobs_.Get(kJob).status().code(), absl::StatusCode::kNotFound);
  sessions_.clear();
  EXPECT_EQ(Beat(0).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(HealthManagerTest, RoundEndedTurnsItsMembersAwayWithoutAPoll) {
  StartJob(2);
  BeatAll();
  health_.RoundEnded(kJob, 0);  // an older round: nothing changes
  ASSERT_TRUE(Beat(0).ok());
  health_.RoundEnded(kJob, 1);
  EXPECT_EQ(Beat(0).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Complete(1, true, 0, "").status().code(),
            absl::StatusCode::kAborted);
  EXPECT_THAT(ended_, IsEmpty());
  EXPECT_THAT(losses_, IsEmpty()) << "a superseded round loses nobody";
}

TEST_F(HealthManagerTest, ReformRequestReachesEveryMemberWithItsNextAnswer) {
  StartJob(2);
  BeatAll();
  ASSERT_FALSE(last_response_.reform_at_step_boundary());
  EXPECT_FALSE(*Beat(0)) << "nothing changed: no answer";
  health_.ReformRequested(kJob, 0);  // an older round: nothing changes
  EXPECT_FALSE(*Beat(0));
  health_.ReformRequested(kJob, 1);
  for (int rank : {0, 1}) {
    ASSERT_TRUE(*Beat(rank)) << "an answer for rank " << rank;
    EXPECT_TRUE(last_response_.reform_at_step_boundary());
    EXPECT_EQ(last_response_.job_state(), v1::JOB_STATE_RUNNING);
  }
  EXPECT_FALSE(*Beat(0)) << "said once per stream";
  EXPECT_THAT(losses_, IsEmpty());
}

TEST_F(HealthManagerTest, ReformRequestedBeforeMonitoringStartsIsKept) {
  StartJob(2);
  // The rendezvous asks before any member of round 1 heartbeated.
  health_.ReformRequested(kJob, 1);
  ASSERT_TRUE(*Beat(1));
  EXPECT_TRUE(last_response_.reform_at_step_boundary());
}

TEST_F(HealthManagerTest, SuccessInARoundSupersededBeforeThePollIsAborted) {
  StartJob(1);
  BeatAll();
  // The rendezvous supersedes the round; this manager has not polled since.
  ASSERT_TRUE(jobs_.RecordRoundSuperseded(kJob, "a new process joined").ok());
  absl::StatusOr<v1::JobState> state = Complete(0, true, 0, "");
  EXPECT_EQ(state.status().code(), absl::StatusCode::kAborted) << state.status();
  EXPECT_THAT(ended_, IsEmpty()) << "the job did not end";
  EXPECT_EQ(Beat(0).status().code(), absl::StatusCode::kAborted);
}

// ---------------------------------------------------------------------------
// Restart on durable state

// The coordinator's managers after a restart on the same storage.
struct RestartedHealth {
  RestartedHealth(Storage* storage, Clock* clock)
      : jobs(storage, clock),
        health(&jobs, clock, HealthConfig(),
               [this](const HealthManager::Loss& loss) {
                 lost.push_back(loss.rank);
               }) {
    EXPECT_TRUE(jobs.LoadFromStorage().ok());
    health.MonitorRunningRounds();
  }
  absl::StatusOr<bool> Beat(int rank) {
    if (sessions[rank] == nullptr) sessions[rank] = HealthManager::NewSession();
    v1::HeartbeatRequest request;
    request.mutable_member()->set_job_id(kJob);
    request.mutable_member()->set_round(1);
    request.mutable_member()->set_rank(rank);
    request.mutable_member()->set_incarnation_id(Incarnation(rank));
    v1::HeartbeatResponse response;
    return health.Heartbeat(sessions[rank].get(), &request, &response);
  }
  v1::JobStatus Status() {
    absl::StatusOr<v1::JobStatus> status = jobs.Get(kJob);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  JobManager jobs;
  std::vector<int> lost;  // ranks reported to the loss callback
  HealthManager health;
  std::map<int, std::unique_ptr<HealthManager::Session>> sessions;
};

TEST_F(HealthManagerTest, AfterARestartMembersHaveAGraceOfFiveWindows) {
  StartJob(3);
  BeatAll();
  ASSERT_TRUE(Complete(2, true, 0, "").ok());
  clock_.Advance(absl::Seconds(20));  // the coordinator is down
  RestartedHealth restarted(&storage_, &clock_);
  clock_.Advance(absl::Milliseconds(3500));
  restarted.health.Poll();
  EXPECT_THAT(restarted.lost, IsEmpty()) << "past one window, within the grace";
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(restarted.Beat(0).ok());
  restarted.health.Poll();
  EXPECT_THAT(restarted.lost, IsEmpty()) << "within the grace";
  clock_.Advance(absl::Seconds(1));  // 15.5 s: past 5 windows of 3 s
  restarted.health.Poll();
  EXPECT_THAT(restarted.lost, IsEmpty())
      << "rank 0 came back 1 s ago: others may still be on their way";
  clock_.Advance(absl::Seconds(2) + absl::Milliseconds(10));
  ASSERT_TRUE(restarted.Beat(0).ok());
  restarted.health.Poll();
  // Rank 1 never came back: silent since the restart, and for a window
  // since the last member came back. Rank 2 had succeeded before the
  // crash and stays EXITED.
  EXPECT_EQ(restarted.lost, std::vector<int>{1});
  const v1::JobStatus status = restarted.Status();
  EXPECT_EQ(status.members(0).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(status.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_THAT(status.members(1).state_reason(),
              HasSubstr("since the coordinator restarted"));
  EXPECT_EQ(status.members(2).state(), v1::MEMBER_STATE_EXITED);
}

TEST_F(HealthManagerTest, AfterARestartSuccessesBeforeItStillCount) {
  StartJob(2);
  BeatAll();
  ASSERT_TRUE(Complete(1, true, 0, "").ok());
  RestartedHealth restarted(&storage_, &clock_);
  v1::ReportCompletionRequest done;
  done.mutable_member()->set_job_id(kJob);
  done.mutable_member()->set_round(1);
  done.mutable_member()->set_rank(0);
  done.mutable_member()->set_incarnation_id(Incarnation(0));
  done.set_success(true);
  absl::StatusOr<v1::JobState> state = restarted.health.ReportCompletion(done);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::JOB_STATE_SUCCEEDED);
}

// ---------------------------------------------------------------------------
// Refused heartbeats

TEST_F(HealthManagerTest, RefusesHeartbeatsThatAreNotFromAMember) {
  StartJob(2);
  v1::HeartbeatResponse response;
  auto beat = [&](v1::MemberRef ref, v1::WorkerMetrics metrics = {}) {
    auto session = HealthManager::NewSession();
    v1::HeartbeatRequest request;
    *request.mutable_member() = std::move(ref);
    *request.mutable_metrics() = std::move(metrics);
    return health_.Heartbeat(session.get(), &request, &response).status();
  };
  v1::MemberRef unknown = Ref(0);
  unknown.set_job_id("other");
  EXPECT_EQ(beat(unknown).code(), absl::StatusCode::kNotFound);
  v1::MemberRef bad_id = Ref(0);
  bad_id.set_job_id("Not A Label");
  EXPECT_EQ(beat(bad_id).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(beat(Ref(0, /*round=*/0)).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status future = beat(Ref(0, /*round=*/2));
  EXPECT_EQ(future.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(future.message(), HasSubstr("has not closed"));
  absl::Status beyond = beat(Ref(2));
  EXPECT_EQ(beyond.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(beyond.message(), HasSubstr("world size 2"));
  v1::MemberRef impostor = Ref(1);
  impostor.set_incarnation_id("someone-else");
  absl::Status wrong = beat(impostor);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.message(), HasSubstr("is process 'inc-1'"));
  v1::WorkerMetrics negative;
  negative.set_step(-1);
  EXPECT_EQ(beat(Ref(0), negative).code(), absl::StatusCode::kInvalidArgument);
  v1::WorkerMetrics flood;
  for (int i = 0; i < 257; ++i) flood.add_recent_collectives()->set_sequence(i);
  EXPECT_EQ(beat(Ref(0), flood).code(), absl::StatusCode::kInvalidArgument);
  // Times the job's JSON views could not print.
  v1::WorkerMetrics bad_time;
  bad_time.add_first_bucket_ready()->mutable_time()->set_nanos(-5);
  EXPECT_EQ(beat(Ref(0), bad_time).code(), absl::StatusCode::kInvalidArgument);
  v1::WorkerMetrics bad_duration;
  bad_duration.mutable_round_start()->mutable_first_step()->set_nanos(2000000000);
  EXPECT_EQ(beat(Ref(0), bad_duration).code(), absl::StatusCode::kInvalidArgument);
  v1::WorkerMetrics negative_duration;
  negative_duration.mutable_round_start()->mutable_process_group()->set_seconds(-1);
  EXPECT_EQ(beat(Ref(0), negative_duration).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(health_.heartbeats(), 0);
}

// ---------------------------------------------------------------------------
// Status

TEST_F(HealthManagerTest, StatusShowsTheLatestMetricsAndLastSeen) {
  StartJob(2);
  v1::WorkerMetrics metrics;
  metrics.set_state(v1::WORKER_STATE_TRAINING);
  metrics.set_step(41);
  metrics.set_samples_per_second(1234.5);
  metrics.mutable_step_timings()->set_step_seconds(0.25);
  metrics.add_recent_collectives()->set_sequence(1);
  v1::BucketStats* bucket = metrics.add_buckets();
  bucket->set_index(0);
  bucket->set_bytes(1 << 20);
  ASSERT_TRUE(Beat(0, metrics).ok());
  clock_.Advance(absl::Milliseconds(500));
  metrics.set_step(42);
  ASSERT_TRUE(Beat(0, metrics).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.members(0).metrics().step(), 42);
  EXPECT_EQ(status.members(0).metrics().samples_per_second(), 1234.5);
  EXPECT_EQ(status.members(0).metrics().step_timings().step_seconds(), 0.25);
  EXPECT_EQ(status.members(0).metrics().recent_collectives_size(), 0)
      << "events are consumed, not shown";
  EXPECT_EQ(FromProtoTime(status.members(0).last_seen()), clock_.Now());
  EXPECT_FALSE(status.members(1).has_metrics());
  EXPECT_EQ(health_.heartbeats(), 2);
  // Buckets only when asked for.
  EXPECT_EQ(status.members(0).metrics().buckets_size(), 0);
  v1::JobStatus full = *jobs_.Get(kJob);
  health_.Describe(&full, /*with_buckets=*/true);
  ASSERT_EQ(full.members(0).metrics().buckets_size(), 1);
  EXPECT_EQ(full.members(0).metrics().buckets(0).bytes(), 1 << 20);
}

// ---------------------------------------------------------------------------
// Diagnosis

v1::WorkerMetrics Collectives(int64_t started, int64_t finished) {
  v1::WorkerMetrics m;
  m.set_last_started_collective(started);
  m.set_last_finished_collective(finished);
  return m;
}

TEST_F(HealthManagerTest, HangNamesTheRanksBehind) {
  StartJob(4);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(Beat(r, Collectives(183, 183)).ok());
  ASSERT_TRUE(Beat(3, Collectives(182, 182)).ok());
  for (int i = 0; i < 29; ++i) {
    Advance(absl::Seconds(1));
    EXPECT_THAT(Status().diagnosis().hang(), IsEmpty()) << i;
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(Beat(r, Collectives(183, 183)).ok());
    ASSERT_TRUE(Beat(3, Collectives(182, 182)).ok());
  }
  Advance(absl::Seconds(1));
  EXPECT_EQ(Status().diagnosis().hang(),
            "ranks 0,1,2 finished collective #183; rank 3 finished #182 and "
            "has not started #183 (no collective finished for 30s)");
  // Progress clears it.
  ASSERT_TRUE(Beat(3, Collectives(183, 183)).ok());
  EXPECT_THAT(Status().diagnosis().hang(), IsEmpty());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING) << "a hang only reports";
}

// A hang verdict asks the rank behind and one ahead for their stacks, each
// once, in its next heartbeat answer; their answers show in the diagnosis,
// grouped, until progress ends the verdict.
TEST_F(HealthManagerTest, AHangAsksForStacksAndShowsThem) {
  StartJob(3);
  const auto beat_all = [this] {
    ASSERT_TRUE(Beat(0, Collectives(9, 9)).ok());
    ASSERT_TRUE(Beat(1, Collectives(9, 9)).ok());
    ASSERT_TRUE(Beat(2, Collectives(8, 8)).ok());
  };
  beat_all();
  for (int i = 0; i < 29; ++i) {
    Advance(absl::Seconds(1));
    beat_all();
    ASSERT_FALSE(Status().diagnosis().has_hang_stacks());
  }
  Advance(absl::Seconds(1));
  ASSERT_THAT(Status().diagnosis().hang(), HasSubstr("rank 2 finished #8"));
  ASSERT_EQ(Status().diagnosis().hang_stacks().hung_ranks_size(), 1);
  EXPECT_EQ(Status().diagnosis().hang_stacks().healthy_rank(), 0);

  // Rank 1 is not asked; ranks 2 and 0 are, once.
  EXPECT_EQ(Beat(1, Collectives(9, 9)).value_or(true), false);
  EXPECT_EQ(Beat(2, Collectives(8, 8)).value_or(false), true);
  const int64_t request = last_response_.stacks_request();
  EXPECT_NE(request, 0);
  EXPECT_EQ(last_response_.job_state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Beat(2, Collectives(8, 8)).value_or(true), false);
  EXPECT_EQ(Beat(0, Collectives(9, 9)).value_or(false), true);
  EXPECT_EQ(last_response_.stacks_request(), request);

  v1::WorkerMetrics answer = Collectives(8, 8);
  answer.mutable_thread_stacks()->set_request(request);
  v1::ThreadStack* main = answer.mutable_thread_stacks()->add_threads();
  main->set_name("gradsync-worker");
  main->add_frames("gradsync::Trainer::MaybeHang()");
  ASSERT_TRUE(Beat(2, answer).ok());
  const v1::HangStacks stacks = Status().diagnosis().hang_stacks();
  ASSERT_EQ(stacks.groups_size(), 1);
  EXPECT_EQ(stacks.groups(0).frames(0), "gradsync::Trainer::MaybeHang()");
  EXPECT_EQ(stacks.groups(0).ranks(0), 2);
  EXPECT_TRUE(stacks.groups(0).hung_only());
  EXPECT_FALSE(Status().members(2).metrics().has_thread_stacks())
      << "an event: in the diagnosis, not the member's metrics";

  // Progress ends the verdict and its stacks.
  ASSERT_TRUE(Beat(2, Collectives(9, 9)).ok());
  EXPECT_FALSE(Status().diagnosis().has_hang_stacks());
}

TEST_F(HealthManagerTest, HangWithRanksInsideACollective) {
  StartJob(3);
  ASSERT_TRUE(Beat(0, Collectives(8, 7)).ok());
  ASSERT_TRUE(Beat(1, Collectives(8, 7)).ok());
  ASSERT_TRUE(Beat(2, Collectives(7, 7)).ok());
  for (int i = 0; i < 31; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(Beat(0, Collectives(8, 7)).ok());
    ASSERT_TRUE(Beat(1, Collectives(8, 7)).ok());
    ASSERT_TRUE(Beat(2, Collectives(7, 7)).ok());
  }
  health_.Poll();
  EXPECT_THAT(Status().diagnosis().hang(),
              HasSubstr("ranks 0,1 started collective #8 and have not finished "
                        "it; rank 2 finished #7 and has not started #8"));
}

TEST_F(HealthManagerTest, AllRanksIdleBetweenCollectivesIsNoHang) {
  StartJob(2);
  BeatAll(Collectives(5, 5));
  for (int i = 0; i < 40; ++i) {
    Advance(absl::Seconds(1));
    BeatAll(Collectives(5, 5));
  }
  EXPECT_THAT(Status().diagnosis().hang(), IsEmpty());
}

// Metrics of a rank at `step`, whose latest step took `step_time`, with
// its collective counters.
v1::WorkerMetrics Stepping(int64_t step, absl::Duration step_time,
                           int64_t started, int64_t finished) {
  v1::WorkerMetrics m = Collectives(started, finished);
  m.set_step(step);
  m.mutable_step_timings()->set_step_seconds(absl::ToDoubleSeconds(step_time));
  return m;
}

// The hang timeout follows the step times: a job of 50 ms steps is found
// hung a second after its collectives stop (heartbeating every 400 ms), one
// of 10 s steps is not at a minute; status shows the timeout in force.
TEST_F(HealthManagerTest, TheHangTimeoutFollowsTheStepTimes) {
  StartJob(2, v1::FAILURE_POLICY_DEGRADE, absl::Milliseconds(400));
  StepAll50ms(4);
  v1::JobStatus status = Status();
  EXPECT_TRUE(status.diagnosis().hang_timeout_self_set());
  EXPECT_EQ(FromProtoDuration(status.diagnosis().hang_timeout()), absl::Seconds(1));
  // Rank 1 stops before step 5's collective; rank 0 waits inside it.
  ASSERT_TRUE(Beat(0, Stepping(4, absl::Milliseconds(50), 5, 4)).ok());
  Advance(absl::Milliseconds(900));
  EXPECT_THAT(Status().diagnosis().hang(), IsEmpty());
  Advance(absl::Milliseconds(200));
  EXPECT_THAT(Status().diagnosis().hang(),
              HasSubstr("rank 0 started collective #5 and has not finished it; "
                        "rank 1 finished #4 and has not started #5"));
}

// The coordinator sees progress only in heartbeats: with 1 s heartbeats a
// job of 50 ms steps, whose timeout would set itself to 1 s, is given two
// intervals, since a healthy job's next report of a finished collective
// may come a whole interval after the last (later on a loaded machine).
TEST_F(HealthManagerTest, TheHangTimeoutIsAtLeastTwoHeartbeatIntervals) {
  StartJob(2);
  StepAll50ms(8);
  v1::JobStatus status = Status();
  EXPECT_TRUE(status.diagnosis().hang_timeout_self_set());
  EXPECT_EQ(FromProtoDuration(status.diagnosis().hang_timeout()),
            absl::Seconds(2));
  // Rank 0 waits in collective #9 that rank 1 has not started.
  ASSERT_TRUE(Beat(0, Stepping(8, absl::Milliseconds(50), 9, 8)).ok());
  Advance(absl::Milliseconds(900));
  ASSERT_TRUE(Beat(0, Stepping(8, absl::Milliseconds(50), 9, 8)).ok());
  ASSERT_TRUE(Beat(1, Stepping(8, absl::Milliseconds(50), 8, 8)).ok());
  Advance(absl::Milliseconds(900));
  EXPECT_THAT(Status().diagnosis().hang(), IsEmpty()) << "1.8 s";
  ASSERT_TRUE(Beat(0, Stepping(8, absl::Milliseconds(50), 9, 8)).ok());
  ASSERT_TRUE(Beat(1, Stepping(8, absl::Milliseconds(50), 8, 8)).ok());
  Advance(absl::Milliseconds(200));
  EXPECT_THAT(Status().diagnosis().hang(),
              HasSubstr("rank 1 finished #8 and has not started #9"));
}

// Who is behind is read from reports sent after the stall settled (half
// the hang timeout after the last progress): a rank whose last report is
// older (its heartbeat delayed) and shows it before the collective the
// others wait in is not asked as behind on it; the request waits for its
// next heartbeat, and names only the rank that is behind.
TEST_F(HealthManagerTest, StacksAreAskedOnReportsFromAfterTheStallSettled) {
  StartJob(3, v1::FAILURE_POLICY_DEGRADE, absl::Milliseconds(400));
  StepAll50ms(4);
  ASSERT_EQ(FromProtoDuration(Status().diagnosis().hang_timeout()),
            absl::Seconds(1));
  // Rank 2 stops before collective #5; ranks 0 and 1 wait inside it, and
  // rank 1 is not heard from for a while.
  Advance(absl::Milliseconds(550));
  ASSERT_TRUE(Beat(0, Stepping(4, absl::Milliseconds(50), 5, 4)).ok());
  ASSERT_TRUE(Beat(2, Stepping(4, absl::Milliseconds(50), 4, 4)).ok());
  Advance(absl::Milliseconds(500));
  EXPECT_THAT(Status().diagnosis().hang(),
              HasSubstr("ranks 1,2 finished #4 and have not started #5"));
  EXPECT_FALSE(Status().diagnosis().has_hang_stacks());
  ASSERT_TRUE(Beat(1, Stepping(4, absl::Milliseconds(50), 5, 4)).ok());
  Advance(absl::Milliseconds(10));
  EXPECT_THAT(Status().diagnosis().hang(),
              HasSubstr("rank 2 finished #4 and has not started #5"));
  const v1::HangStacks stacks = Status().diagnosis().hang_stacks();
  ASSERT_EQ(stacks.hung_ranks_size(), 1);
  EXPECT_EQ(stacks.hung_ranks(0), 2);
  EXPECT_EQ(stacks.healthy_rank(), 0);
}

TEST_F(HealthManagerTest, SlowStepsAreNoHang) {
  StartJob(2);
  for (int step = 1; step <= 4; ++step) {
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(Beat(r, Stepping(step, absl::Seconds(10), step, step)).ok());
    }
  }
  EXPECT_EQ(FromProtoDuration(Status().diagnosis().hang_timeout()),
            absl::Seconds(100));
  // A 10 s step: one rank is in its all-reduce for most of it.
  ASSERT_TRUE(Beat(0, Stepping(4, absl::Seconds(10), 5, 4)).ok());
  for (int i = 0; i < 60; ++i) Advance(absl::Seconds(1));
  EXPECT_THAT(Status().diagnosis().hang(), IsEmpty());
}

v1::WorkerMetrics Fingerprint(int64_t sequence, const std::string& op,
                              int64_t count, int bucket) {
  v1::WorkerMetrics m;
  v1::CollectiveFingerprint* f = m.add_recent_collectives();
  f->set_sequence(sequence);
  f->set_op(op);
  f->set_dtype("float32");
  f->set_count(count);
  f->set_bucket_index(bucket);
  return m;
}

TEST_F(HealthManagerTest, MismatchedCollectivesFailTheJobWithADesyncError) {
  StartJob(3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(Beat(r, Fingerprint(4, "allreduce", 1024, 0)).ok());
  }
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Beat(0, Fingerprint(5, "allreduce", 1024, 1)).ok());
  ASSERT_TRUE(Beat(1, Fingerprint(5, "allreduce", 1024, 1)).ok());
  ASSERT_TRUE(Beat(2, Fingerprint(5, "allreduce", 512, 2)).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  const std::string expected =
      "collectives desynchronized at #5: rank 0 issued allreduce of 1024 "
      "float32 (bucket 1) but rank 2 issued allreduce of 512 float32 "
      "(bucket 2)";
  EXPECT_THAT(status.diagnosis().desync(), HasSubstr(expected));
  EXPECT_THAT(status.reason(), HasSubstr(expected));
  // The workers hear it on their next heartbeat.
  ASSERT_TRUE(*Beat(1));
  EXPECT_EQ(last_response_.job_state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(last_response_.reason(), HasSubstr("desynchronized at #5"));
}

// ---------------------------------------------------------------------------
// Replica divergence

// Metrics carrying one replica fingerprint of `step` with `tensors`.
v1::WorkerMetrics Replica(int64_t step, std::vector<uint64_t> tensors) {
  v1::WorkerMetrics m;
  v1::ReplicaFingerprint* f = m.add_replica_fingerprints();
  f->set_step(step);
  for (uint64_t t : tensors) f->add_tensors(t);
  f->add_tensor_names("fc1.weight");
  f->add_tensor_names("fc1.bias");
  return m;
}

TEST_F(HealthManagerTest, ADivergedMinorityIsHealedFromTheMajority) {
  StartJob(3);
  BeatAll(Replica(50, {1, 2}));
  EXPECT_EQ(Status().diagnosis().replicas_verified_step(), 50);
  ASSERT_TRUE(Beat(0, Replica(100, {3, 4})).ok());
  ASSERT_TRUE(Beat(1, Replica(100, {3, 5})).ok());
  EXPECT_TRUE(heals_.empty());
  ASSERT_TRUE(Beat(2, Replica(100, {3, 4})).ok());
  ASSERT_EQ(heals_.size(), 1u);
  EXPECT_EQ(heals_[0].round, 1);
  EXPECT_EQ(heals_[0].ranks, std::vector<int>{1});
  EXPECT_THAT(heals_[0].reason,
              HasSubstr("replicas diverged at step 100: rank(s) 1 differ from "
                        "rank(s) 0,2 (the majority) in fc1.bias; healing"));
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);  // the rendezvous heals
  EXPECT_EQ(status.diagnosis().divergence().step(), 100);
  EXPECT_EQ(status.diagnosis().divergence().tensors(0), "fc1.bias");
  // The round's later fingerprints ask for nothing more.
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(Beat(r, Replica(150, {static_cast<uint64_t>(r), 0})).ok());
  }
  EXPECT_EQ(heals_.size(), 1u);
  // The round the heal re-forms still shows the divergence.
  Supersede(1, heals_[0].reason);
  Advance(absl::Seconds(1));
  CloseRound(2);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(Beat(r, {}, 2).ok());
  status = Status();
  EXPECT_EQ(status.round(), 2);
  EXPECT_EQ(status.diagnosis().divergence().round(), 1);
  EXPECT_EQ(status.diagnosis().divergence().step(), 100);
}

TEST_F(HealthManagerTest, DivergencePolicyFailFailsTheJob) {
  divergence_policy_ = v1::DIVERGENCE_POLICY_FAIL;
  StartJob(3);
  ASSERT_TRUE(Beat(0, Replica(10, {1, 2})).ok());
  ASSERT_TRUE(Beat(1, Replica(10, {1, 2})).ok());
  ASSERT_TRUE(Beat(2, Replica(10, {9, 2})).ok());
  EXPECT_TRUE(heals_.empty());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.reason(), HasSubstr("rank(s) 2 differ"));
  EXPECT_THAT(status.reason(), HasSubstr("divergence_policy is fail"));
}

TEST_F(HealthManagerTest, TwoReplicasThatDisagreeFailTheJobWithoutAMajority) {
  StartJob(2);
  ASSERT_TRUE(Beat(0, Replica(10, {1, 2})).ok());
  ASSERT_TRUE(Beat(1, Replica(10, {1, 3})).ok());
  EXPECT_TRUE(heals_.empty());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.reason(), HasSubstr("with no majority"));
  EXPECT_EQ(status.diagnosis().divergence().ranks_size(), 2);
}

// Completions recorded together (CompletionBatcher's batches) make one
// write of the job's member changes, end the job as one by one would, and
// answer a repeat as the first.
TEST_F(HealthManagerTest, CompletionsOfABatchAreRecordedInOneWrite) {
  StartJob(4);
  std::vector<v1::ReportCompletionRequest> requests(5);
  for (int i = 0; i < 5; ++i) {
    *requests[i].mutable_member() = Ref(i == 4 ? 1 : i);  // rank 1 twice
    requests[i].set_success(true);
  }
  std::vector<const v1::ReportCompletionRequest*> batch;
  for (const auto& r : requests) batch.push_back(&r);
  const std::vector<absl::StatusOr<v1::JobState>> answers =
      health_.ReportCompletions(batch);
  ASSERT_EQ(answers.size(), 5u);
  for (const auto& answer : answers) {
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(*answer, v1::JOB_STATE_SUCCEEDED);
  }
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(status.reason(), HasSubstr("all 4 member(s)"));
  for (const v1::Member& m : status.members()) {
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_EXITED);
  }
  EXPECT_EQ(ended_.size(), 1u);
  EXPECT_EQ(storage_.Scan("jobs/train/changes/", true)->size(), 1u);
}

TEST_F(HealthManagerTest, AFailureInABatchFailsTheJobAndAStrangerIsRefused) {
  StartJob(3);
  std::vector<v1::ReportCompletionRequest> requests(4);
  for (int i = 0; i < 4; ++i) *requests[i].mutable_member() = Ref(i % 3);
  requests[0].set_success(true);
  requests[1].set_exit_code(3);  // rank 1 fails
  requests[1].set_message("boom");
  requests[2].set_success(true);
  requests[3].mutable_member()->set_incarnation_id("someone-else");
  std::vector<const v1::ReportCompletionRequest*> batch;
  for (const auto& r : requests) batch.push_back(&r);
  const std::vector<absl::StatusOr<v1::JobState>> answers =
      health_.ReportCompletions(batch);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(answers[i].ok()) << answers[i].status();
    EXPECT_EQ(*answers[i], v1::JOB_STATE_FAILED);
  }
  EXPECT_EQ(answers[3].status().code(), absl::StatusCode::kFailedPrecondition);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(status.reason(), "rank 1 (host-1) failed with exit code 3: boom");
  for (const v1::Member& m : status.members()) {
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_EXITED);
  }
}

// The last step's fingerprints come with the completions; the members are
// leaving, so a divergence then fails the job instead of healing it.
TEST_F(HealthManagerTest, ADivergenceFoundAtCompletionFailsTheJob) {
  StartJob(3);
  for (int r = 0; r < 3; ++r) {
    v1::ReportCompletionRequest request;
    *request.mutable_member() = Ref(r);
    request.set_success(true);
    *request.mutable_metrics() = Replica(300, {r == 1 ? 8u : 7u, 2});
    ASSERT_TRUE(health_.ReportCompletion(request).ok());
  }
  EXPECT_TRUE(heals_.empty());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.reason(), HasSubstr("too late to heal"));
}

// A member that finished cannot rejoin a re-formed round: a divergence its
// fingerprints complete after it finished fails the job instead of healing.
TEST_F(HealthManagerTest, ADivergenceFoundAfterAMemberFinishedFailsTheJob) {
  StartJob(3);
  v1::ReportCompletionRequest done;
  *done.mutable_member() = Ref(0);
  done.set_success(true);
  *done.mutable_metrics() = Replica(300, {7, 2});
  ASSERT_TRUE(health_.ReportCompletion(done).ok());
  ASSERT_TRUE(Beat(1, Replica(300, {8, 2})).ok());
  ASSERT_TRUE(Beat(2, Replica(300, {7, 2})).ok());
  EXPECT_TRUE(heals_.empty());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.diagnosis().divergence().ranks(),
              ::testing::ElementsAre(1));
}

TEST_F(HealthManagerTest, DifferentOpsAtTheSameSequenceAreADesync) {
  StartJob(2);
  ASSERT_TRUE(Beat(0, Fingerprint(1, "allreduce", 10, -1)).ok());
  ASSERT_TRUE(Beat(1, Fingerprint(1, "broadcast", 10, -1)).ok());
  EXPECT_THAT(Status().diagnosis().desync(),
              HasSubstr("rank 0 issued allreduce of 10 float32 but rank 1 "
                        "issued broadcast of 10 float32"));
}

// Every rank reports step `step` ready at base + offsets[rank].
void ReportSteps(int first_step, int steps,
                 const std::vector<absl::Duration>& offsets,
                 const std::function<absl::Status(int, v1::WorkerMetrics)>&
                     beat) {
  const absl::Time base = absl::FromUnixSeconds(1767225600);
  for (size_t r = 0; r < offsets.size(); ++r) {
    v1::WorkerMetrics m;
    for (int s = first_step; s < first_step + steps; ++s) {
      v1::StepReady* ready = m.add_first_bucket_ready();
      ready->set_step(s);
      *ready->mutable_time() =
          ToProtoTime(base + absl::Seconds(s) + offsets[r]);
    }
    ASSERT_TRUE(beat(static_cast<int>(r), m).ok());
  }
}

// Steps `first`..`first + steps - 1` of an exact global batch of 24
// micro-batches, 8 a rank: rank 2 takes 3 ms a micro-batch, the others 1 ms,
// and its first bucket is 250 ms late; one heartbeat a rank and step.
void ReportSlowRank(int first, int steps,
                    const std::function<absl::Status(int, v1::WorkerMetrics)>&
                        beat) {
  const absl::Time base = absl::FromUnixSeconds(1767225600);
  for (int s = first; s < first + steps; ++s) {
    for (int r = 0; r < 3; ++r) {
      v1::WorkerMetrics m;
      m.set_step(s);
      v1::MicroBatchLoad* load = m.mutable_micro_batches();
      load->set_share(8);
      load->set_per_step(24);
      load->set_seconds(r == 2 ? 0.003 : 0.001);
      v1::StepReady* ready = m.add_first_bucket_ready();
      ready->set_step(s);
      *ready->mutable_time() = ToProtoTime(
          base + absl::Seconds(s) + absl::Milliseconds(r == 2 ? 250 : 0));
      ASSERT_TRUE(beat(r, m).ok());
    }
  }
}

TEST_F(HealthManagerTest, AStragglerOfAGlobalBatchIsRebalancedOnce) {
  StartJob(3);
  auto beat = [this](int rank, v1::WorkerMetrics m) {
    return Beat(rank, std::move(m)).status();
  };
  // Flagged after 5 steps (StragglerDetector), once every rank made 4
  // reports (ShareBalancer::kWindow).
  ReportSlowRank(1, 4, beat);
  EXPECT_THAT(rebalances_, IsEmpty());
  ReportSlowRank(5, 1, beat);
  ASSERT_EQ(rebalances_.size(), 1u);
  EXPECT_EQ(rebalances_[0].round, 1);
  EXPECT_EQ(rebalances_[0].shares[2], 3);
  EXPECT_THAT(rebalances_[0].reason,
              HasSubstr("rank 2 takes 3.0x as long per micro-batch"));
  const v1::Rebalance shown = Status().diagnosis().rebalance();
  EXPECT_EQ(shown.round(), 1);
  EXPECT_EQ(shown.shares(2), 3);
  EXPECT_EQ(shown.verdict(), rebalances_[0].reason);
  // Asked once a round.
  ReportSlowRank(6, 8, beat);
  EXPECT_EQ(rebalances_.size(), 1u);
  // Shown while the next round is not monitored yet.
  Supersede(1, "rebalancing");
  CloseRound(2);
  v1::JobStatus next = *jobs_.Get(kJob);
  ASSERT_EQ(next.round(), 2);
  health_.Describe(&next);
  EXPECT_EQ(next.diagnosis().rebalance().round(), 1);
}

TEST_F(HealthManagerTest, AStragglerPolicyOfReportOnlyNamesIt) {
  straggler_policy_ = v1::STRAGGLER_POLICY_REPORT;
  StartJob(3);
  ReportSlowRank(1, 12, [this](int rank, v1::WorkerMetrics m) {
    return Beat(rank, std::move(m)).status();
  });
  EXPECT_EQ(Status().diagnosis().stragglers_size(), 1);
  EXPECT_THAT(rebalances_, IsEmpty());
  EXPECT_FALSE(Status().diagnosis().has_rebalance());
}

TEST_F(HealthManagerTest, ConsistentlyLateRankIsFlaggedWithItsLag) {
  StartJob(3);
  auto beat = [this](int rank, v1::WorkerMetrics m) {
    return Beat(rank, std::move(m)).status();
  };
  // Rank 1 jitters by 20 ms; rank 2 is 250 ms late every step.
  const std::vector<absl::Duration> offsets = {
      absl::ZeroDuration(), absl::Milliseconds(20), absl::Milliseconds(250)};
  ReportSteps(0, 4, offsets, beat);
  EXPECT_EQ(Status().diagnosis().stragglers_size(), 0)
      << "not flagged before 5 steps";
  ReportSteps(4, 4, offsets, beat);
  v1::JobStatus status = Status();
  ASSERT_EQ(status.diagnosis().stragglers_size(), 1);
  EXPECT_EQ(status.diagnosis().stragglers(0).rank(), 2);
  EXPECT_EQ(FromProtoDuration(status.diagnosis().stragglers(0).lag()),
            absl::Milliseconds(250));
  EXPECT_EQ(status.diagnosis().stragglers(0).steps(), 8);
  EXPECT_EQ(FromProtoDuration(status.members(2).lag()),
            absl::Milliseconds(250));
  EXPECT_EQ(FromProtoDuration(status.members(1).lag()),
            absl::Milliseconds(20));
  EXPECT_FALSE(status.members(0).has_lag());
  // Once it catches up for most of the window, the flag goes.
  ReportSteps(8, 5, {absl::ZeroDuration(), absl::ZeroDuration(),
                           absl::ZeroDuration()},
              beat);
  EXPECT_EQ(Status().diagnosis().stragglers_size(), 0);
}

// ---------------------------------------------------------------------------
// Past the coordinator's heartbeat capacity, simulated on the FakeClock

// kWorld members of one job send heartbeats at the interval they were last
// told (1 s at first), each at its own phase; the coordinator handles what
// they sent in order, at most capacity_ per second, and reports how long
// the oldest heartbeat waiting has waited as its queue delay (what
// CompletionQueues' probes measure). With the default capacity, a quarter
// of what the members send at 1 s.
class OverloadTest : public ::testing::Test {
 protected:
  static constexpr int kWorld = 1000;
  static constexpr char kWitness[] = "witness";
  static constexpr absl::Duration kStep = absl::Milliseconds(10);

  struct Member {
    std::string job = kJob;
    int rank = 0;
    absl::Duration interval = absl::Seconds(1);
    absl::Time next_send;
    absl::Time last_send;
    bool sending = true;
    absl::Time last_handled = absl::InfinitePast();
    v1::HeartbeatResponse answer;  // the last one
  };

  // Starts the job (and, with `witness`, a job of witness_world_ members
  // beside it: members_[kWorld...]) and their members; their first
  // heartbeats spread over `spread`.
  void Start(bool shedding, absl::Duration spread = absl::Seconds(1),
             bool witness = false) {
    AddJob(kJob, kWorld, spread);
    if (witness) AddJob(kWitness, witness_world_, spread);
    HealthConfig health;
    health.shedding.enabled = shedding;
    if (per_queue_) health.completion_queues = 2;
    health_ = std::make_unique<HealthManager>(&jobs_, &clock_, health);
  }

  void AddJob(const std::string& id, int world, absl::Duration spread) {
    v1::JobConfig config;
    config.set_job_id(id);
    config.set_min_nodes(world);
    if (id == kWitness) config.set_missed_heartbeats(witness_missed_);
    ASSERT_TRUE(jobs_.Create(config).ok());
    std::vector<v1::Member> members(world);
    for (int r = 0; r < world; ++r) {
      members[r].set_rank(r);
      members[r].mutable_node()->set_hostname(absl::StrCat("host-", r));
      members[r].mutable_node()->set_incarnation_id(Incarnation(r));
      members[r].set_state(v1::MEMBER_STATE_ACTIVE);
    }
    ASSERT_TRUE(jobs_.RecordRoundClosed(id, 1, v1::BACKEND_GLOO,
                                        std::move(members))
                    .ok());
    for (int r = 0; r < world; ++r) {
      Member m;
      m.job = id;
      m.rank = r;
      m.next_send = clock_.Now() + spread * r / world;
      members_.push_back(m);
      sessions_.push_back(HealthManager::NewSession(
          !per_queue_ ? -1 : id == kWitness ? 1 : 0));
    }
  }

  void Run(absl::Duration d) {
    const absl::Time end = clock_.Now() + d;
    while (clock_.Now() < end) Step();
  }

  void Step() {
    clock_.Advance(kStep);
    const absl::Time now = clock_.Now();
    for (size_t r = 0; r < members_.size(); ++r) {
      Member& m = members_[r];
      while (m.sending && m.next_send <= now) {
        if (witness_apart_ && m.job == kWitness) {
          absl::Time due = m.next_send + queued_ + witness_turns_;
          if (m.rank < stalled_ranks_) {
            due = std::max(due, witness_stalled_until_);
          }
          apart_.push_back({static_cast<int>(r), due});
        } else {
          waiting_.push_back({r, m.next_send});
        }
        m.last_send = m.next_send;
        m.next_send += m.interval;
      }
    }
    std::vector<std::pair<int, absl::Time>> later;
    for (const auto& [r, due] : apart_) {
      if (due <= now) {
        Handle(r);
      } else {
        later.push_back({r, due});
      }
    }
    apart_ = std::move(later);
    // Capacity is not banked while idle.
    const double per_step = capacity_ * absl::ToDoubleSeconds(kStep);
    credit_ = std::min(credit_ + per_step, per_step + 1);
    while (credit_ >= 1 && !waiting_.empty()) {
      const int r = waiting_.front().first;
      waiting_.pop_front();
      credit_ -= 1;
      Handle(r);
    }
    const absl::Duration delay = std::max(
        queued_, waiting_.empty() ? absl::ZeroDuration()
                                  : now - waiting_.front().second);
    absl::flat_hash_map<std::string, absl::Duration> turn_waits;
    if (witness_turns_ > absl::ZeroDuration()) {
      turn_waits[kWitness] = witness_turns_;
    }
    if (flood_turns_ > absl::ZeroDuration()) turn_waits[kJob] = flood_turns_;
    const absl::Duration longest =
        std::max({delay + flood_queue_extra_, witness_turns_, flood_turns_});
    if (per_queue_) {
      const std::vector<absl::Duration> queues = {delay + flood_queue_extra_,
                                                  queued_};
      health_->ReportQueueDelay(longest, queues, std::move(turn_waits));
    } else {
      health_->ReportQueueDelay(longest, {}, std::move(turn_waits));
    }
    health_->Poll();
  }

  // The coordinator handles one heartbeat of `r`; the member obeys the
  // interval of an answer from its next heartbeat on.
  void Handle(int r) {
    Member& m = members_[r];
    v1::HeartbeatRequest request;
    request.mutable_member()->set_job_id(m.job);
    request.mutable_member()->set_round(1);
    request.mutable_member()->set_rank(m.rank);
    request.mutable_member()->set_incarnation_id(Incarnation(m.rank));
    v1::HeartbeatResponse answer;
    absl::StatusOr<bool> told =
        health_->Heartbeat(sessions_[r].get(), &request, &answer);
    ASSERT_TRUE(told.ok()) << told.status();
    m.last_handled = clock_.Now();
    if (!*told) return;
    m.answer = answer;
    m.interval = FromProtoDuration(answer.heartbeat_interval());
    m.next_send = m.last_send + m.interval;
  }

  v1::JobStatus Status(const std::string& job = kJob) {
    absl::StatusOr<v1::JobStatus> status = jobs_.Get(job);
    EXPECT_TRUE(status.ok()) << status.status();
    health_->Describe(&*status);
    return *status;
  }

  absl::Duration WitnessDetection();
  // The witness's hung rank 1 is found as on an idle coordinator (3 missed
  // heartbeats, within 2 steps: `why`), its reason speaks of no allowance,
  // and nobody of the other job is lost.
  void ExpectWitnessFoundAsAlone(const std::string& why);

  // The job and the witness on a coordinator that is behind for as long as
  // the test runs: every heartbeat waits 550 ms in its queues (a queue
  // delay above the 500 ms it allows), which changes no gap between two;
  // the witness's heartbeats wait nothing else.
  void StartBehind() {
    capacity_ = 1e6;
    queued_ = absl::Milliseconds(550);
    witness_apart_ = true;
    Start(/*shedding=*/true, absl::Seconds(1), /*witness=*/true);
  }

  int Lost() {
    int lost = 0;
    const v1::JobStatus status = Status();
    for (const v1::Member& m : status.members()) {
      lost += m.state() == v1::MEMBER_STATE_LOST ? 1 : 0;
    }
    return lost;
  }

  FakeClock clock_;
  InMemoryStorage storage_;
  JobManager jobs_{&storage_, &clock_};
  std::unique_ptr<HealthManager> health_;
  std::vector<std::unique_ptr<HealthManager::Session>> sessions_;
  std::vector<Member> members_;
  std::deque<std::pair<int, absl::Time>> waiting_;  // member, when sent
  double capacity_ = 250;  // heartbeats handled per second, at most
  double credit_ = 0;
  // A queue delay reported besides the simulated one: the witness's
  // heartbeats (with witness_apart_) wait that long; a steady one changes
  // no gap between two.
  absl::Duration queued_;
  // The witness job's heartbeats do not wait behind the others' (its
  // connections are not the congested ones): handled queued_ after they
  // are sent, or, for its ranks below stalled_ranks_, sent before
  // witness_stalled_until_, not before that (their connections starved
  // meanwhile). apart_: those waiting, and when they are handled.
  bool witness_apart_ = false;
  int witness_world_ = 3;
  int witness_missed_ = 3;
  int stalled_ranks_ = 3;
  absl::Time witness_stalled_until_ = absl::InfinitePast();
  std::vector<std::pair<int, absl::Time>> apart_;
  // Queue delays reported one by one: the job's streams on queue 0, whose
  // delay is the simulated one plus flood_queue_extra_, the witness's on
  // queue 1, whose delay is queued_.
  bool per_queue_ = false;
  absl::Duration flood_queue_extra_;
  // Under a heartbeat cap, each job's wait for turns (reported as such):
  // the witness's heartbeats (with witness_apart_) wait witness_turns_
  // more; the flood's wait is only reported.
  absl::Duration witness_turns_;
  absl::Duration flood_turns_;
};

TEST_F(OverloadTest, WithoutSheddingLiveMembersAreLost) {
  Start(/*shedding=*/false);
  Run(absl::Seconds(10));
  EXPECT_GT(Lost(), 0) << "the simulated overload is real";
  EXPECT_THAT(Status().diagnosis().overload(),
              HasSubstr("does not shed load (--shed_heartbeats=false)"));
}

TEST_F(OverloadTest, NoLiveMemberIsLostAndSendersSlowDown) {
  Start(/*shedding=*/true);
  Run(absl::Seconds(60));
  EXPECT_EQ(Lost(), 0);
  const HeartbeatShedder::State state = health_->shedding();
  // 1,000/s at 1 s; the smallest power of 2 that fits 70% of 250/s is 8.
  EXPECT_EQ(state.factor, 8);
  EXPECT_EQ(state.shed_periods, 1);
  EXPECT_DOUBLE_EQ(state.capacity, 250);
  for (const Member& m : members_) {
    EXPECT_EQ(m.interval, absl::Seconds(8));
    EXPECT_TRUE(m.answer.shedding_load());
  }
  EXPECT_LE(waiting_.size(), 10u) << "the backlog drained";
  EXPECT_THAT(Status().diagnosis().overload(),
              HasSubstr("it asks for heartbeats every 8s (the job's 1s x8), "
                        "so a silent member is found LOST after 24s"));
}

TEST_F(OverloadTest, AMemberThatStopsIsStillLostByTheSlowedInterval) {
  Start(/*shedding=*/true);
  Run(absl::Seconds(60));
  ASSERT_EQ(health_->shedding().factor, 8);
  members_[7].sending = false;  // hung: its stream stays open
  const absl::Time last = members_[7].last_handled;
  while (Status().members(7).state() == v1::MEMBER_STATE_ACTIVE &&
         clock_.Now() - last < absl::Seconds(60)) {
    Step();
  }
  const absl::Duration silent = clock_.Now() - last;
  v1::JobStatus status = Status();
  ASSERT_EQ(status.members(7).state(), v1::MEMBER_STATE_LOST);
  // 3 missed heartbeats at 8 s; at most twice that while behind.
  EXPECT_GT(silent, absl::Seconds(24));
  EXPECT_LE(silent, absl::Seconds(48));
  EXPECT_THAT(status.members(7).state_reason(),
              HasSubstr("missed 3 heartbeats (every 8s: the job's 1s x8 while "
                        "the coordinator sheds heartbeat load)"));
  EXPECT_EQ(Lost(), 1);
}

// How long after its last heartbeat was handled the witness job's rank 1,
// which stops heartbeating (hung, its stream open), is found LOST.
absl::Duration OverloadTest::WitnessDetection() {
  Member& stopped = members_[kWorld + 1];
  stopped.sending = false;
  const absl::Time last = stopped.last_handled;
  while (Status(kWitness).members(1).state() == v1::MEMBER_STATE_ACTIVE &&
         clock_.Now() - last < absl::Seconds(120)) {
    Step();
  }
  EXPECT_EQ(Status(kWitness).members(1).state(), v1::MEMBER_STATE_LOST);
  return clock_.Now() - last;
}

void OverloadTest::ExpectWitnessFoundAsAlone(const std::string& why) {
  const absl::Duration detection = WitnessDetection();
  EXPECT_GT(detection, absl::Seconds(3));
  EXPECT_LE(detection, absl::Seconds(3) + 2 * kStep) << why;
  EXPECT_EQ(Lost(), 0) << "nobody of the other job is lost";
  EXPECT_THAT(Status(kWitness).members(1).state_reason(),
              AllOf(HasSubstr("missed 3 heartbeats (every 1s): last heard"),
                    Not(HasSubstr("more"))));
}

// Job isolation: a job of 1,000 members floods a coordinator that handles
// 250 heartbeats a second; a job of 3 beside it is not slowed with it, and
// its failures are found as fast as on an idle coordinator (3 missed
// heartbeats at its 1 s interval), not after 3 x 8 s.
TEST_F(OverloadTest, ASmallJobBesideAFloodingOneIsFoundLostAsFastAsAlone) {
  Start(/*shedding=*/true, absl::Seconds(1), /*witness=*/true);
  Run(absl::Seconds(60));
  ASSERT_GE(health_->shedding().factor, 8);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_GE(members_[r].interval, absl::Seconds(8)) << "the flood is slowed";
  }
  for (int r = 0; r < witness_world_; ++r) {
    EXPECT_EQ(members_[kWorld + r].interval, absl::Seconds(1)) << r;
  }
  EXPECT_THAT(Status(kWitness).diagnosis().overload(),
              Not(HasSubstr("asks for heartbeats every")));
  const absl::Duration flooded = WitnessDetection();
  EXPECT_GT(flooded, absl::Seconds(3));
  EXPECT_LE(flooded, absl::Seconds(3) * 1.2) << "goal: within 1.2x of alone";
  EXPECT_EQ(Lost(), 0) << "nobody of the flooding job is lost";
  EXPECT_THAT(Status(kWitness).members(1).state_reason(),
              HasSubstr("missed 3 heartbeats (every 1s)"));
}

// While the coordinator is behind, LOST deadlines are extended by the time
// behind, for heartbeats starved where no probe sees them; a job whose own
// heartbeats keep time meanwhile is not starved, and is given only what
// the queue delay grew by, here nothing (it is steady). The witness's rank
// 1 hangs 10 s into the episode.
TEST_F(OverloadTest, AJobThatKeepsTimeIsNotGivenTheTimeBehind) {
  StartBehind();
  Run(absl::Seconds(10));
  ASSERT_TRUE(health_->shedding().behind);
  ASSERT_GE(health_->allowance(), absl::Seconds(9));
  ExpectWitnessFoundAsAlone(
      "a steady queue delay delays no heartbeat more than the last");
}

// A job that keeps time is allowed what the queue delay grew by since its
// member's last heartbeat was handled: a jump of 1.5 s delays every next
// heartbeat by that much. Here the witness has 2 members sending 0.7 s
// apart and is lost after 2 missed heartbeats, and the jump comes just
// after the second sent: the first member reaches its 2 s while the other
// is still on time (the job keeps time). None is lost.
// The parameter says where the jump is: the largest queue delay (the only
// one reported), the witness's own queue's with every other's, or under a
// heartbeat cap the witness job's wait for turns (its queue steady).
enum class Jump { kLargest, kOwnQueue, kTurns };

class GrewByTest : public OverloadTest,
                   public ::testing::WithParamInterface<Jump> {};

TEST_P(GrewByTest, AJobThatKeepsTimeIsGivenWhatItsDelayGrewBy) {
  per_queue_ = GetParam() != Jump::kLargest;
  witness_world_ = 2;
  witness_missed_ = 2;
  capacity_ = 1e6;
  queued_ = absl::Milliseconds(550);
  witness_apart_ = true;
  Start(/*shedding=*/true, absl::Milliseconds(1400), /*witness=*/true);
  Run(absl::Milliseconds(10750));
  ASSERT_TRUE(health_->shedding().behind);
  (GetParam() == Jump::kTurns ? witness_turns_ : queued_) +=
      absl::Milliseconds(1500);
  Run(absl::Seconds(6));
  const v1::JobStatus witness = Status(kWitness);
  for (int r = 0; r < witness_world_; ++r) {
    EXPECT_EQ(witness.members(r).state(), v1::MEMBER_STATE_ACTIVE)
        << r << ": " << witness.members(r).state_reason();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Where, GrewByTest,
    ::testing::Values(Jump::kLargest, Jump::kOwnQueue, Jump::kTurns),
    [](const ::testing::TestParamInfo<Jump>& info) {
      switch (info.param) {
        case Jump::kLargest:
          return "Largest";
        case Jump::kOwnQueue:
          return "OwnQueue";
        case Jump::kTurns:
          return "Turns";
      }
      return "Unknown";
    });

// A job that keeps time is allowed what its own queue's delay grew by, not
// what another queue's did: the flood's queue falls 1.5 s further behind
// just after the witness's rank 1 stopped, its own queue's by 0.4 ms. It
// is found as fast as with no growth anywhere, and its reason does not
// speak of an allowance under a millisecond ("after 0 more").
TEST_F(OverloadTest, AJobThatKeepsTimeIsNotGivenWhatAnotherQueuesDelayGrewBy) {
  per_queue_ = true;
  StartBehind();
  Run(absl::Seconds(10));
  ASSERT_TRUE(health_->shedding().behind);
  flood_queue_extra_ = absl::Milliseconds(1500);
  queued_ += absl::Microseconds(400);
  ExpectWitnessFoundAsAlone("the witness's queue's delay grew by 0.4 ms only");
}

// Under a heartbeat cap (HeartbeatPacer), a job that keeps time is allowed
// what its own wait for turns grew by, not what another job's did: the
// flood's wait grows to 1.5 s just after the witness's rank 1 stopped, the
// witness waits for none. It is found as fast as with no wait anywhere.
TEST_F(OverloadTest, AJobThatKeepsTimeIsNotGivenWhatAnotherJobsTurnsGrewBy) {
  per_queue_ = true;
  StartBehind();
  Run(absl::Seconds(10));
  ASSERT_TRUE(health_->shedding().behind);
  flood_turns_ = absl::Milliseconds(1500);
  ExpectWitnessFoundAsAlone("only the flood's wait for turns grew");
}

// The same episode with members of the witness starved together for 4 s
// (their connections, or their node's): two or more overdue at once, or
// none on time, and the job does not keep time; the time behind is
// allowed: none is lost. Parameters: the witness's size, and how many of
// its members starve.
class StarvedTogetherTest
    : public OverloadTest,
      public ::testing::WithParamInterface<std::pair<int, int>> {};

TEST_P(StarvedTogetherTest, AJobStarvedTogetherIsGivenTheTimeBehind) {
  std::tie(witness_world_, stalled_ranks_) = GetParam();
  StartBehind();
  Run(absl::Seconds(10));
  ASSERT_TRUE(health_->shedding().behind);
  witness_stalled_until_ = clock_.Now() + absl::Seconds(4);
  Run(absl::Seconds(6));
  const v1::JobStatus witness = Status(kWitness);
  for (int r = 0; r < witness_world_; ++r) {
    EXPECT_EQ(witness.members(r).state(), v1::MEMBER_STATE_ACTIVE)
        << r << ": " << witness.members(r).state_reason();
  }
  EXPECT_EQ(Lost(), 0);
}

INSTANTIATE_TEST_SUITE_P(SomeOrAll, StarvedTogetherTest,
                         ::testing::Values(std::make_pair(3, 2),
                                           std::make_pair(3, 3),
                                           std::make_pair(1, 1)));

// A job whose heartbeats came late in the episode (a 2 s stall here) is
// given the time behind for the rest of it: its hung member is found
// only once the time behind no longer covers its silence.
TEST_F(OverloadTest, AJobWhoseHeartbeatsCameLateIsGivenTheTimeBehind) {
  StartBehind();
  Run(absl::Seconds(8));
  witness_stalled_until_ = clock_.Now() + absl::Seconds(2);
  Run(absl::Seconds(4));
  ASSERT_TRUE(health_->shedding().behind);
  const absl::Duration detection = WitnessDetection();
  EXPECT_GT(detection, absl::Seconds(6)) << "the time behind was allowed";
  EXPECT_EQ(Status(kWitness).members(0).state(), v1::MEMBER_STATE_ACTIVE);
  // The reason says why it took longer than 3 missed heartbeats.
  EXPECT_THAT(Status(kWitness).members(1).state_reason(),
              MatchesRegex("missed 3 heartbeats \\(every 1s\\): last heard "
                           "[0-9.]+s ago, after [0-9.]+s more while the "
                           "coordinator is behind \\([1-9][0-9]* of the "
                           "job's [0-9]+ heartbeats since it fell behind came "
                           "late\\)"));
}

TEST_F(OverloadTest, ASmallJobOnAnIdleCoordinatorIsFoundLostAfterItsWindow) {
  capacity_ = 1e6;  // the same two jobs, no overload
  Start(/*shedding=*/true, absl::Seconds(1), /*witness=*/true);
  Run(absl::Seconds(60));
  ASSERT_EQ(health_->shedding().factor, 1);
  const absl::Duration alone = WitnessDetection();
  EXPECT_GT(alone, absl::Seconds(3));
  EXPECT_LE(alone, absl::Seconds(3) + 2 * kStep);
}

TEST_F(OverloadTest, ABrokenStreamsGraceStretchesLikeTheSilenceLimit) {
  Start(/*shedding=*/true);
  Run(absl::Seconds(60));
  ASSERT_EQ(health_->shedding().factor, 8);
  members_[3].sending = false;  // killed: its stream broke
  health_->StreamBroken(sessions_[3].get());
  const absl::Time broke = clock_.Now();
  while (Status().members(3).state() == v1::MEMBER_STATE_ACTIVE &&
         clock_.Now() - broke < absl::Seconds(60)) {
    Step();
  }
  v1::JobStatus status = Status();
  ASSERT_EQ(status.members(3).state(), v1::MEMBER_STATE_LOST);
  EXPECT_GT(clock_.Now() - broke, absl::Seconds(24));
  EXPECT_LE(clock_.Now() - broke, absl::Seconds(24) + 2 * kStep);
  EXPECT_THAT(status.members(3).state_reason(),
              HasSubstr("heartbeat stream broke (process killed or connection "
                        "lost) and it did not heartbeat again within 24s"));
  EXPECT_EQ(Lost(), 1);
}

// Every member's stream breaks once (a blip: a proxy restart, a reset
// connection) and the member heartbeats again on a new stream a random
// time later, shorter than the grace: nobody is lost, while shedding too.
TEST_F(OverloadTest, BlipsShorterThanTheGraceLoseNobody) {
  Start(/*shedding=*/true);
  Run(absl::Seconds(20));
  ASSERT_GT(health_->shedding().factor, 1);
  std::vector<absl::Time> back(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    // Broken at once, each back 0.1-2.9 s later (the reporter reconnects
    // at its next heartbeat after at most 0.5 s of backoff).
    health_->StreamBroken(sessions_[r].get());
    back[r] = clock_.Now() + absl::Milliseconds(100 + (r * 7919) % 2800);
    members_[r].sending = false;
  }
  const absl::Time end = clock_.Now() + absl::Seconds(30);
  while (clock_.Now() < end) {
    for (int r = 0; r < kWorld; ++r) {
      if (!members_[r].sending && clock_.Now() >= back[r]) {
        sessions_[r] = HealthManager::NewSession();
        members_[r].sending = true;
        members_[r].next_send = clock_.Now();
      }
    }
    Step();
  }
  EXPECT_EQ(Lost(), 0);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(OverloadTest, WhenTheLoadEasesMembersGoBackToTheJobInterval) {
  Start(/*shedding=*/true);
  Run(absl::Seconds(60));
  ASSERT_EQ(health_->shedding().factor, 8);
  // 900 members finish: the 100 left (every 10th, so their heartbeats
  // stay spread over the interval) send 12.5/s.
  for (int r = 0; r < kWorld; ++r) {
    if (r % 10 == 0) continue;
    v1::ReportCompletionRequest done;
    done.mutable_member()->set_job_id(kJob);
    done.mutable_member()->set_round(1);
    done.mutable_member()->set_rank(r);
    done.mutable_member()->set_incarnation_id(Incarnation(r));
    done.set_success(true);
    ASSERT_TRUE(health_->ReportCompletion(done).ok());
    members_[r].sending = false;
  }
  Run(absl::Seconds(60));
  EXPECT_EQ(health_->shedding().factor, 1);
  for (int r = 0; r < kWorld; r += 10) {
    EXPECT_EQ(members_[r].interval, absl::Seconds(1)) << "rank " << r;
    EXPECT_FALSE(members_[r].answer.shedding_load());
  }
  EXPECT_EQ(Status().diagnosis().overload(), "");
  EXPECT_EQ(Lost(), 0);
}

TEST_F(OverloadTest, ASlowStartOfALargeRoundIsNotAnOverload) {
  capacity_ = 1e6;
  // First heartbeats come over 2.5 s: they have no gap to judge.
  Start(/*shedding=*/true, /*spread=*/absl::Milliseconds(2500));
  Run(absl::Seconds(10));
  EXPECT_EQ(health_->shedding().shed_periods, 0);
  EXPECT_EQ(Lost(), 0);
}

// A large round whose first heartbeats take longer than a detection window
// to be read (spread over 8 s here; a coordinator past its capacity accepts
// tens of thousands of new streams slowly, where no queue probe sees them)
// loses nobody while its members keep being heard for the first time.
TEST_F(OverloadTest, ARoundWhoseFirstHeartbeatsComeSlowlyLosesNobody) {
  capacity_ = 1e6;
  Start(/*shedding=*/true, /*spread=*/absl::Seconds(8));
  Run(absl::Seconds(15));
  EXPECT_EQ(Lost(), 0);
}

// A member that never heartbeats is found one window (3 intervals) after
// the last of the others was first heard, not before.
TEST_F(OverloadTest, AMemberThatNeverStartsIsLostAWindowAfterTheLastFirstHeard) {
  capacity_ = 1e6;
  Start(/*shedding=*/true, /*spread=*/absl::Seconds(8));
  members_[500].sending = false;  // would start 4 s in
  const absl::Time start = clock_.Now();
  while (Lost() == 0 && clock_.Now() - start < absl::Seconds(30)) Step();
  const absl::Duration found = clock_.Now() - start;
  EXPECT_GT(found, absl::Seconds(8 + 3) - kStep);
  EXPECT_LE(found, absl::Seconds(8 + 3) + 4 * kStep);
  EXPECT_EQ(Lost(), 1);
  EXPECT_THAT(Status().members(500).state_reason(),
              HasSubstr("sent no heartbeat in the"));
}

// While first heartbeats keep coming, an unheard member is waited for at
// most as long as a silent one can be: missed x interval x max_factor
// (48 s). Here they come over 120 s: those not heard by then are LOST.
TEST_F(OverloadTest, AnUnheardMemberIsWaitedForAtMostTheLargestWindow) {
  capacity_ = 1e6;
  Start(/*shedding=*/true, /*spread=*/absl::Seconds(120));
  const absl::Time start = clock_.Now();
  while (Lost() == 0 && clock_.Now() - start < absl::Seconds(60)) Step();
  const absl::Duration found = clock_.Now() - start;
  EXPECT_GT(found, absl::Seconds(48) - kStep);
  EXPECT_LE(found, absl::Seconds(48) + 4 * kStep);
  EXPECT_EQ(Status().members(999).state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(Status().members(0).state(), v1::MEMBER_STATE_ACTIVE);
}

// The bench's start on one core: a job heard a moment ago, then the
// coordinator takes in the other jobs' new streams ahead of reading the
// open ones (where no queue probe sees it; nothing comes late, it is not
// read). Here the witness's 200 members are heard in the first second,
// then 1,000 members open their streams over 3 s, and what the witness
// sends meanwhile is read only at 4.5 s: nobody is LOST (257 of a job of
// 10,000 were, 3 s after being heard).
TEST_F(OverloadTest, AStormOfNewStreamsStarvingAJobLosesNobody) {
  capacity_ = 1e6;
  witness_apart_ = true;
  witness_world_ = 200;
  stalled_ranks_ = witness_world_;
  Start(/*shedding=*/true, absl::Seconds(1), /*witness=*/true);
  const absl::Time start = clock_.Now();
  for (int r = 0; r < kWorld; ++r) {
    members_[r].next_send = start + absl::Seconds(1) + absl::Seconds(3) * r / kWorld;
  }
  Run(absl::Seconds(1));
  witness_stalled_until_ = start + absl::Milliseconds(4500);
  Run(absl::Seconds(7));
  const v1::JobStatus witness = Status(kWitness);
  for (const v1::Member& m : witness.members()) {
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_ACTIVE)
        << "rank " << m.rank() << ": " << m.state_reason();
  }
  EXPECT_EQ(Lost(), 0);
  EXPECT_FALSE(health_->shedding().behind) << "the storm is over";
}

TEST_F(OverloadTest, AMassFailureIsNotMistakenForAnOverload) {
  capacity_ = 1e6;
  Start(/*shedding=*/true);
  Run(absl::Seconds(5));
  for (int r = 0; r < 600; ++r) members_[r].sending = false;
  const absl::Time stopped = clock_.Now();
  Run(absl::Seconds(4) + 2 * kStep);
  EXPECT_EQ(Lost(), 600) << "found within 3 intervals of their last one";
  EXPECT_EQ(health_->shedding().shed_periods, 0);
  EXPECT_LE(clock_.Now() - stopped, absl::Seconds(5));
}

TEST(HealthSettingsTest, JobConfigValidatesThemAndKeepsZeroAsDefault) {
  v1::JobConfig config;
  config.set_job_id("j");
  absl::StatusOr<v1::JobConfig> normalized = NormalizeJobConfig(config);
  ASSERT_TRUE(normalized.ok());
  EXPECT_EQ(normalized->missed_heartbeats(), 0) << "the coordinator's default";
  EXPECT_EQ(normalized->failure_policy(), v1::FAILURE_POLICY_UNSPECIFIED);

  v1::JobConfig bad = config;
  bad.set_missed_heartbeats(-1);
  EXPECT_THAT(NormalizeJobConfig(bad).status().message(),
              HasSubstr("missed_heartbeats must be in [0, 1000]"));
  bad = config;
  bad.set_failure_policy(static_cast<v1::FailurePolicy>(7));
  EXPECT_THAT(NormalizeJobConfig(bad).status().message(),
              HasSubstr("unknown failure_policy 7"));
  bad = config;
  *bad.mutable_heartbeat_interval() = ToProtoDuration(absl::Seconds(-1));
  EXPECT_EQ(NormalizeJobConfig(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(NormalizeJobConfig(bad).status().message(),
              HasSubstr("heartbeat_interval"));
}

TEST(FormatRanksTest, ListsAndCollapsesRuns) {
  EXPECT_EQ(FormatRanks({2, 0, 1}), "0,1,2");
  EXPECT_EQ(FormatRanks({0, 1, 2, 3, 7, 9, 10, 11, 12}), "0-3,7,9-12");
  EXPECT_EQ(FormatRanks({0, 2, 4, 6}, 2), "0,2,...");
  EXPECT_EQ(FormatRanks({}), "");
}

}  // namespace
}  // namespace gradsync
