// CheckStepReport: what a training loop may report after a step, and the
// error naming the field of a report it may not.
#include "worker/runtime/step_report.h"

#include <functional>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

StepReport Good() {
  StepReport report;
  report.step = 1;
  report.step_time = absl::Milliseconds(40);
  report.micro_batches = 3;
  report.micro_batches_per_step = 8;
  report.micro_batch_time = absl::Milliseconds(10);
  report.ddp.exposed_communication = absl::Milliseconds(2);
  return report;
}

TEST(CheckStepReportTest, TakesAReportOfPlainValues) {
  EXPECT_TRUE(CheckStepReport(Good(), /*samples=*/24).ok());
  StepReport zeros;
  zeros.step = 1;
  EXPECT_TRUE(CheckStepReport(zeros, 0).ok());
  StepReport diverged = Good();
  diverged.loss = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(CheckStepReport(diverged, 24).ok());  // worth showing
  StepReport all = Good();
  all.micro_batches = all.micro_batches_per_step;
  EXPECT_TRUE(CheckStepReport(all, 24).ok());
}

struct BadReport {
  std::string name;
  std::function<void(StepReport&, int64_t&)> spoil;
  std::string message;
};

class CheckStepReportRefusesTest : public ::testing::TestWithParam<BadReport> {
};

TEST_P(CheckStepReportRefusesTest, NamingTheField) {
  StepReport report = Good();
  int64_t samples = 24;
  GetParam().spoil(report, samples);
  const absl::Status checked = CheckStepReport(report, samples);
  EXPECT_EQ(checked.code(), absl::StatusCode::kInvalidArgument) << checked;
  EXPECT_THAT(checked.message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, CheckStepReportRefusesTest,
    ::testing::Values(
        BadReport{"StepZero", [](StepReport& r, int64_t&) { r.step = 0; },
                  "step is the committed step, 1 or more, not 0"},
        BadReport{"NegativeSamples", [](StepReport&, int64_t& s) { s = -1; },
                  "sample count must be 0 or more, not -1"},
        BadReport{"NegativeEpoch",
                  [](StepReport& r, int64_t&) { r.epoch = -2; }, "epoch"},
        BadReport{"NegativeMicroBatches",
                  [](StepReport& r, int64_t&) { r.micro_batches = -1; },
                  "micro_batches must be 0 or more"},
        BadReport{"MoreMicroBatchesThanTheStepHas",
                  [](StepReport& r, int64_t&) { r.micro_batches = 9; },
                  "micro_batches (9) must not exceed its "
                  "micro_batches_per_step (8)"},
        BadReport{
            "NegativeStepTime",
            [](StepReport& r, int64_t&) { r.step_time = absl::Seconds(-1); },
            "step time must be a finite time of 0 or more, not -1s"},
        BadReport{"InfiniteStepTime",  // what absl::Seconds(NaN) gives
                  [](StepReport& r, int64_t&) {
                    r.step_time =
                        absl::Seconds(std::numeric_limits<double>::quiet_NaN());
                  },
                  "step time must be a finite time"},
        BadReport{"NegativeCommitWait",
                  [](StepReport& r, int64_t&) {
                    r.commit_wait = -absl::Milliseconds(1);
                  },
                  "commit wait"},
        BadReport{
            "NegativeUpdate",
            [](StepReport& r, int64_t&) { r.update = -absl::Milliseconds(1); },
            "update time"},
        BadReport{"NegativeMicroBatchTime",
                  [](StepReport& r, int64_t&) {
                    r.micro_batch_time = -absl::Milliseconds(1);
                  },
                  "micro-batch time"},
        BadReport{"NegativeExposedCommunication",
                  [](StepReport& r, int64_t&) {
                    r.ddp.exposed_communication = -absl::Milliseconds(1);
                  },
                  "exposed communication time"},
        BadReport{"NegativeForward",
                  [](StepReport& r, int64_t&) {
                    r.ddp.forward = -absl::Milliseconds(1);
                  },
                  "forward time"},
        BadReport{"NegativeBuckets",
                  [](StepReport& r, int64_t&) { r.ddp.buckets = -1; },
                  "bucket count"}),
    [](const ::testing::TestParamInfo<BadReport>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace gradsync
