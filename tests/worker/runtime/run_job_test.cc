// RunJob against an in-process coordinator, with a Trainer that fails in a
// way no rejoin can fix: the job's failure is reported before the trainer
// is told that its round ended (Trainer::RoundEnded, where a Python
// trainer aborts its collectives still pending: aborted before the report,
// they let the peers re-form the round first), and after a success too;
// a step report the runtime refuses.
#include "worker/runtime/run_job.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"
#include "server/coordinator.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Returns `outcome` from Train; at RoundEnded, records the job's state as
// the coordinator has it then.
class OneRoundTrainer : public Trainer {
 public:
  OneRoundTrainer(absl::Status outcome, std::string coordinator)
      : outcome_(std::move(outcome)), coordinator_(std::move(coordinator)) {}

  absl::Status Train(const Round& round) override {
    ++rounds_;
    return outcome_;
  }
  int64_t committed_step() const override { return 0; }
  void RoundEnded() override {
    ClientOptions options;
    options.target = coordinator_;
    absl::StatusOr<v1::JobStatus> job =
        (*GrpcCoordinatorClient::Create(options))->GetJob("train");
    ASSERT_TRUE(job.ok()) << job.status();
    state_at_round_end_ = job->state();
  }

  int rounds() const { return rounds_; }
  std::optional<v1::JobState> state_at_round_end() const {
    return state_at_round_end_;
  }

 private:
  const absl::Status outcome_;
  const std::string coordinator_;
  int rounds_ = 0;
  std::optional<v1::JobState> state_at_round_end_;
};

class RunJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorConfig config;
    config.listen_address = "127.0.0.1:0";
    config.poll_interval = absl::Milliseconds(5);
    config.health.heartbeat_interval = absl::Milliseconds(100);
    config.health.missed_heartbeats = 50;  // no loss from a slow test machine
    coordinator_ = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator_->Start().ok());
  }

  JobOptions Options() const {
    JobOptions options;
    options.coordinator = absl::StrCat("127.0.0.1:", coordinator_->port());
    options.job = "train";
    options.shared_memory = false;
    return options;
  }

  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(RunJobTest, AFailureIsReportedBeforeTheRoundEnds) {
  OneRoundTrainer trainer(absl::InternalError("the loop raised ValueError"),
                          Options().coordinator);
  const absl::Status done = RunJob(Options(), &trainer);
  EXPECT_EQ(done.code(), absl::StatusCode::kInternal) << done;
  EXPECT_EQ(trainer.rounds(), 1);
  EXPECT_EQ(trainer.state_at_round_end(), v1::JOB_STATE_FAILED);
}

TEST_F(RunJobTest, RoundEndedFollowsASuccessToo) {
  OneRoundTrainer trainer(absl::OkStatus(), Options().coordinator);
  ASSERT_TRUE(RunJob(Options(), &trainer).ok());
  EXPECT_EQ(trainer.rounds(), 1);
  ASSERT_TRUE(trainer.state_at_round_end().has_value());
  EXPECT_NE(trainer.state_at_round_end(), v1::JOB_STATE_FAILED);
}

// Reports a step the runtime must refuse, then the same step made right.
class BadReportTrainer : public Trainer {
 public:
  absl::Status Train(const Round& round) override {
    StepReport report;
    report.step = 1;
    report.step_time = absl::Seconds(-1);
    refused_ = round.report_step(report, /*samples=*/4);
    report.step_time = absl::Milliseconds(5);
    return round.report_step(report, /*samples=*/4);
  }
  int64_t committed_step() const override { return 1; }

  const absl::Status& refused() const { return refused_; }

 private:
  absl::Status refused_;
};

TEST_F(RunJobTest, ABadStepReportIsRefusedAndTheNextOneTaken) {
  BadReportTrainer trainer;
  ASSERT_TRUE(RunJob(Options(), &trainer).ok());
  EXPECT_EQ(trainer.refused().code(), absl::StatusCode::kInvalidArgument)
      << trainer.refused();
  EXPECT_THAT(trainer.refused().message(), HasSubstr("step time"));
}

}  // namespace
}  // namespace gradsync
