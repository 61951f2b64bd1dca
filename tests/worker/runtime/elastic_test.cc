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
#include "worker/client/coordinator_client.h"
#include "tests/testing/eventually.h"
#include "worker/runtime/health_reporter.h"

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
    client_ = *CoordinatorClient::Create(options);
  }

  // Runs one single-process job `job` under `policy` through `trainer`.
  absl::Status Run(const std::string& job, ScriptedTrainer* trainer,
                   int max_recoveries,
                   v1::FailurePolicy policy = v1::FAILURE_POLICY_RECOVER) {
    v1::JoinRequest request;
    request.set_job_id(job);
    request.mutable_config()->set_job_id(job);
    request.mutable_config()->set_min_nodes(1);
    request.mutable_config()->set_failure_policy(policy);
    *request.mutable_node() = LocalNodeDescriptor();
    request.mutable_node()->add_addresses("127.0.0.1");
    ElasticOptions options;
    options.max_recoveries = max_recoveries;
    options.process_group.shared_memory = false;  // Gloo on loopback
    options.process_group.timeout = absl::Seconds(30);
    options.on_assignment = [this](const v1::Assignment& a) {
      announced_.push_back(a.round());
      return absl::OkStatus();
    };
    HealthReporter reporter(client_.get());
    absl::Status status =
        RunElastic(client_.get(), request, options, &reporter, trainer);
    reporter.Stop();
    return status;
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
  std::vector<int64_t> announced_;
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
