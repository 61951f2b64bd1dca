// RunElastic's loop against an in-process coordinator, with a scripted
// RoundTrainer in place of a training loop: a recoverable failure rejoins
// and trains on in the next round (with the trainer's committed step as the
// resume point), at most max_recoveries times; other failures, and any
// failure under the FAIL policy, end it at once.
#include "worker/runtime/elastic.h"

#include <deque>
#include <functional>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "worker/client/grpc_coordinator_client.h"
#include "tests/testing/eventually.h"
#include "worker/runtime/health_reporter.h"
#include "worker/runtime/process_group.h"
#include "worker/runtime/reform.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Answers each round with the next scripted status; each round it trains in
// commits 10 steps.
class ScriptedTrainer : public RoundTrainer {
 public:
  explicit ScriptedTrainer(std::deque<absl::Status> script)
      : script_(std::move(script)) {}

  bool has_state() const override { return committed_ > 0; }
  int64_t committed_step() const override { return committed_; }

  absl::Status TrainRound(const v1::Assignment& assignment, Backend* backend,
                          absl::Duration process_group_time) override {
    EXPECT_GT(process_group_time, absl::ZeroDuration());
    rounds.push_back(assignment);
    world_sizes.push_back(backend->world_size());
    committed_ += 10;
    absl::Status next = script_.front();
    script_.pop_front();
    if (before_first_return) {
      before_first_return();
      before_first_return = nullptr;
    }
    return next;
  }

  std::vector<v1::Assignment> rounds;
  std::vector<int> world_sizes;
  // Runs once, as the first round ends.
  std::function<void()> before_first_return;

 private:
  std::deque<absl::Status> script_;
  int64_t committed_ = 0;
};

class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorConfig config;
    config.listen_address = "127.0.0.1:0";
    config.poll_interval = absl::Milliseconds(5);
    coordinator_ = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator_->Start().ok());
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", coordinator_->port());
    client_ = *GrpcCoordinatorClient::Create(options);
  }

  // Runs one single-process job `job` under `policy` through `trainer`.
  absl::Status Run(const std::string& job, ScriptedTrainer* trainer,
                   int max_recoveries,
                   v1::FailurePolicy policy = v1::FAILURE_POLICY_RECOVER,
                   int max_nodes = 1) {
    v1::JoinRequest request;
    request.set_job_id(job);
    request.mutable_config()->set_job_id(job);
    request.mutable_config()->set_min_nodes(1);
    request.mutable_config()->set_max_nodes(max_nodes);
    // Round 1 closes with this node at once.
    request.mutable_config()->mutable_last_call_timeout()->set_seconds(0);
    request.mutable_config()->set_failure_policy(policy);
    *request.mutable_node() = LocalNodeDescriptor();
    request.mutable_node()->add_addresses("127.0.0.1");
    ElasticOptions options;
    options.max_recoveries = max_recoveries;
    options.process_group.shared_memory = false;  // Gloo on loopback
    options.process_group.timeout = absl::Seconds(30);
    options.on_assignment = [this](const v1::Assignment& a) {
      announced_.push_back(a.round());
      return check_ ? check_(a) : absl::OkStatus();
    };
    HealthReporter reporter(client_.get());
    absl::Status status =
        RunElastic(client_.get(), request, options, &reporter, trainer);
    if (!status.ok() && report_failure_) {
      // As RunJob does with what RunElastic returns.
      reported_ = reporter.Finish(false, 1, std::string(status.message()));
    }
    reporter.Stop();
    return status;
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
  std::vector<int64_t> announced_;
  // Checks each assignment (ElasticOptions::on_assignment); unset: none.
  std::function<absl::Status(const v1::Assignment&)> check_;
  // Whether Run reports a failure as RunJob does, and how that went.
  bool report_failure_ = false;
  absl::Status reported_ = absl::UnknownError("not reported");
};

TEST_F(ElasticTest, RecoverableFailuresRejoinAndResumeFromTheCommittedStep) {
  ScriptedTrainer trainer({absl::UnavailableError("peer left"),
                           absl::DeadlineExceededError("peer silent"),
                           absl::OkStatus()});
  ASSERT_TRUE(Run("recovers", &trainer, 3).ok());
  ASSERT_EQ(trainer.rounds.size(), 3u);
  EXPECT_THAT(announced_, ElementsAre(1, 2, 3));
  EXPECT_THAT(trainer.world_sizes, ElementsAre(1, 1, 1));
  EXPECT_EQ(trainer.rounds[0].resume_step(), 0);
  EXPECT_EQ(trainer.rounds[1].resume_step(), 10);
  EXPECT_EQ(trainer.rounds[2].resume_step(), 20);
  EXPECT_EQ(trainer.rounds[2].source_rank(), 0);
  EXPECT_EQ(trainer.rounds[2].failure_policy(), v1::FAILURE_POLICY_RECOVER);
  absl::StatusOr<v1::JobStatus> job = client_->GetJob("recovers");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->recovery_count(), 2);
  ASSERT_EQ(job->recoveries_size(), 2);
  EXPECT_THAT(job->recoveries(1).cause(), HasSubstr("rejoined after round 2"));
  EXPECT_EQ(job->recoveries(1).resume_step(), 20);
}

TEST_F(ElasticTest, RoundSupersededAsTrainingFinishesIsFinishedInTheNextOne) {
  ScriptedTrainer trainer({absl::OkStatus(), absl::OkStatus()});
  std::thread intruder;
  // As round 1 finishes, a new process on the same node supersedes it (its
  // join waits until our rejoin supersedes round 2 in turn).
  trainer.before_first_return = [&] {
    intruder = std::thread([this] {
      v1::JoinRequest request;
      request.set_job_id("superseded");
      *request.mutable_node() = LocalNodeDescriptor();
      request.mutable_node()->add_addresses("127.0.0.1");
      (void)client_->Join(request);
    });
    ASSERT_TRUE(Eventually([&] {
      absl::StatusOr<v1::JobStatus> job = client_->GetJob("superseded");
      return job.ok() && job->round() == 2;
    }));
  };
  ASSERT_TRUE(Run("superseded", &trainer, 3).ok());
  intruder.join();
  ASSERT_EQ(trainer.rounds.size(), 2u) << "finished again in round 3";
  EXPECT_EQ(trainer.rounds[1].round(), 3);
  EXPECT_EQ(trainer.rounds[1].resume_step(), 10);
  absl::StatusOr<v1::JobStatus> job = client_->GetJob("superseded");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
}

// An assignment the process cannot take (e.g. a local rank past its GPUs)
// ends it, and its report fails the job in the round it was given: not
// in the round before, which the rejoin superseded.
TEST_F(ElasticTest, ARefusedAssignmentIsReportedInItsOwnRound) {
  ScriptedTrainer trainer({absl::UnavailableError("peer left")});
  check_ = [](const v1::Assignment& a) {
    return a.round() == 2 ? absl::FailedPreconditionError("no GPU for it")
                          : absl::OkStatus();
  };
  report_failure_ = true;
  absl::Status status = Run("refused", &trainer, 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(announced_, ElementsAre(1, 2));
  EXPECT_TRUE(reported_.ok()) << reported_;
  absl::StatusOr<v1::JobStatus> job = client_->GetJob("refused");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->reason(), HasSubstr("no GPU for it"));
}

TEST_F(ElasticTest, GivesUpAfterMaxRecoveries) {
  ScriptedTrainer trainer({absl::UnavailableError("first"),
                           absl::UnavailableError("second"),
                           absl::AbortedError("third")});
  absl::Status status = Run("gives-up", &trainer, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("gave up after re-forming the round 2 time(s)"));
  EXPECT_THAT(status.message(), HasSubstr("ABORTED: third"));
  EXPECT_EQ(trainer.rounds.size(), 3u);
}

// A rank whose agreement to stop for a planned re-form failed cannot tell a
// peer that agreed and rejoined first from one that died: when the round it
// rejoins does not follow a planned re-form (here nobody asked for one: the
// rejoin itself superseded the round), that was a recovery.
TEST_F(ElasticTest, AFailedReformVoteIsARecoveryUnlessTheReformWasPlanned) {
  ScriptedTrainer gives_up(
      {ReformVoteFailed(10, absl::UnavailableError("peer gone"))});
  absl::Status status = Run("vote-lost", &gives_up, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("gave up after re-forming the round 0 time(s)"));
  EXPECT_THAT(status.message(), HasSubstr("peer gone"));
  EXPECT_EQ(gives_up.rounds.size(), 1u);

  // Counted: with one recovery allowed, the next failure is one too many.
  ScriptedTrainer counts(
      {ReformVoteFailed(10, absl::UnavailableError("peer gone")),
       absl::AbortedError("later")});
  status = Run("vote-counted", &counts, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("ABORTED: later"));
  ASSERT_EQ(counts.rounds.size(), 2u);
  EXPECT_FALSE(counts.rounds[1].follows_planned_reform());
}

// The same failed agreement in a re-form the coordinator asked for (a node
// joined below MAX), with no member lost: the next round says it follows a
// planned re-form, and nothing is counted, even with no recovery allowed.
TEST_F(ElasticTest, AFailedVoteOfAPlannedReformIsNotARecovery) {
  ScriptedTrainer trainer(
      {ReformVoteFailed(10, absl::AbortedError("peer rejoined first")),
       absl::OkStatus()});
  std::thread second;
  absl::Status second_done = absl::UnknownError("did not run");
  // As round 1 ends, a second node joins (the coordinator asks round 1 to
  // re-form); it forms round 2 with this one and finishes it.
  trainer.before_first_return = [&] {
    second = std::thread([&] {
      v1::JoinRequest request;
      request.set_job_id("planned");
      *request.mutable_node() = LocalNodeDescriptor();
      request.mutable_node()->set_hostname("second-node");
      request.mutable_node()->set_node_id("second-node");
      request.mutable_node()->add_addresses("127.0.0.1");
      absl::StatusOr<v1::Assignment> assignment = client_->Join(request);
      if (!assignment.ok()) {
        second_done = assignment.status();
        return;
      }
      ProcessGroupOptions group;
      group.shared_memory = false;
      group.timeout = absl::Seconds(30);
      absl::StatusOr<std::unique_ptr<Backend>> backend =
          CreateProcessGroup(client_.get(), *assignment, group);
      if (!backend.ok()) {
        second_done = backend.status();
        return;
      }
      HealthReporter reporter(client_.get());
      reporter.Start(*assignment, request.node().incarnation_id());
      second_done = reporter.Finish(true, 0, "");
    });
    ASSERT_TRUE(Eventually([&] {
      absl::StatusOr<v1::JobStatus> job = client_->GetJob("planned");
      return job.ok() && job->spares_size() == 1;
    }));
  };
  absl::Status status =
      Run("planned", &trainer, 0, v1::FAILURE_POLICY_RECOVER, /*max_nodes=*/2);
  second.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(second_done.ok()) << second_done;
  ASSERT_EQ(trainer.rounds.size(), 2u);
  EXPECT_TRUE(trainer.rounds[1].follows_planned_reform());
  EXPECT_THAT(trainer.world_sizes, ElementsAre(1, 2));
  absl::StatusOr<v1::JobStatus> job = client_->GetJob("planned");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
}

TEST_F(ElasticTest, ErrorsARejoinCannotFixEndAtOnce) {
  ScriptedTrainer trainer({absl::InternalError("a bug in the model")});
  absl::Status status = Run("bug", &trainer, 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "a bug in the model");
  EXPECT_EQ(trainer.rounds.size(), 1u);
}

TEST_F(ElasticTest, FailPolicyNeverRejoins) {
  ScriptedTrainer trainer({absl::UnavailableError("peer left")});
  absl::Status status = Run("fails", &trainer, 3, v1::FAILURE_POLICY_FAIL);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  ASSERT_EQ(trainer.rounds.size(), 1u);
  EXPECT_EQ(trainer.rounds[0].failure_policy(), v1::FAILURE_POLICY_FAIL);
}

TEST(RecoverableByRejoiningTest, OnlyLostPeersAndEndedRounds) {
  EXPECT_TRUE(RecoverableByRejoining(absl::UnavailableError("")));
  EXPECT_TRUE(RecoverableByRejoining(absl::DeadlineExceededError("")));
  EXPECT_TRUE(RecoverableByRejoining(absl::AbortedError("")));
  EXPECT_TRUE(RecoverableByRejoining(absl::CancelledError("")));
  EXPECT_FALSE(RecoverableByRejoining(absl::InternalError("")));
  EXPECT_FALSE(RecoverableByRejoining(absl::FailedPreconditionError("")));
  EXPECT_FALSE(RecoverableByRejoining(absl::InvalidArgumentError("")));
  EXPECT_FALSE(RecoverableByRejoining(absl::OkStatus()));
}

}  // namespace
}  // namespace gradsync
