// An exact global batch through shrink and grow (TrainerConfig's
// global_batch_size), with ranks as threads over Gloo: every world size
// trains to the one-rank run's parameters (relative error <= 1e-9), also
// with uneven shares and with more ranks than micro-batches; a run that
// shrinks from 3 ranks to 2, or grows from 2 to 3, at a step boundary ends
// there too. Without the option the per-rank batch makes the result depend
// on the world size (the contrast that shows the check can fail). The runs
// train in double precision: a batch divided otherwise sums its gradients
// in another order, which in single precision differs by rounding (about
// 1e-7), and a ReLU near zero can turn that into another trajectory.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "tests/worker/ddp/state_compare.h"
#include "worker/runtime/reform.h"
#include "worker/trainer/trainer.h"

namespace gradsync {
namespace {

using ::gradsync::testing::TempPath;

constexpr int kSteps = 24;

// 150 synthetic images: 6 steps of 24 per epoch (the 6-sample tail is
// dropped), 4 epochs, micro-batches of 4 (6 per step).
TrainerConfig Config(bool shuffle) {
  TrainerConfig config;
  config.model.kind = "mlp";
  config.model.hidden = 16;
  config.synthetic_size = 150;
  config.batch_size = 4;
  config.global_batch_size = 24;
  config.steps = kSteps;
  config.lr = 0.1;
  config.momentum = 0.5;
  config.shuffle = shuffle;
  config.seed = 11;
  config.log_every = 0;
  config.float64 = true;
  return config;
}

// Runs made on the calling thread (their seeding draws from LibTorch's
// process-wide generator).
std::vector<std::unique_ptr<TrainingRun>> MakeRuns(const TrainerConfig& config,
                                                   int count) {
  std::vector<std::unique_ptr<TrainingRun>> runs;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<std::unique_ptr<TrainingRun>> run = TrainingRun::Create(config);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return {};
    runs.push_back(*std::move(run));
  }
  return runs;
}

// One round of `runs` (rank i is runs[i]) that ends after `stop_after` more
// committed steps (0: runs to the end). Returns each rank's status.
std::vector<absl::Status> TrainRound(
    const std::vector<TrainingRun*>& runs, int64_t round, int stop_after,
    const std::vector<int>& shares = {}) {
  const int world = static_cast<int>(runs.size());
  std::vector<absl::Status> statuses(world);
  RunGlooRanks(world, [&](int rank, Backend* backend) {
    TrainContext context;
    context.backend = backend;
    context.rank = rank;
    context.world_size = world;
    context.round = round;
    context.progress = nullptr;
    context.micro_batch_shares = shares;
    int steps = 0;
    if (stop_after > 0) {
      context.reform_requested = [&steps, stop_after] {
        return ++steps >= stop_after;
      };
    }
    statuses[rank] = runs[rank]->TrainRound(context).status();
  });
  return statuses;
}

std::vector<TrainingRun*> Pointers(
    const std::vector<std::unique_ptr<TrainingRun>>& runs, int count) {
  std::vector<TrainingRun*> pointers;
  for (int i = 0; i < count; ++i) pointers.push_back(runs[i].get());
  return pointers;
}

// Trains `config` on `world` ranks without interruption; rank 0 saves the
// parameters to `params`.
void TrainUninterrupted(TrainerConfig config, int world,
                        const std::string& params) {
  config.save_params = params;
  std::vector<std::unique_ptr<TrainingRun>> runs = MakeRuns(config, world);
  ASSERT_EQ(runs.size(), static_cast<size_t>(world));
  for (const absl::Status& s : TrainRound(Pointers(runs, world), 1, 0)) {
    ASSERT_TRUE(s.ok()) << s;
  }
}

// Round 1 on `before` ranks for `steps_before` steps, then round 2 on
// `after` ranks (the first min(before, after) runs go on; new ones copy
// rank 0's state) to the end; rank 0 saves the parameters to `params`.
void TrainThroughAReform(TrainerConfig config, int before, int after,
                         int steps_before, const std::string& params) {
  config.save_params = params;
  std::vector<std::unique_ptr<TrainingRun>> runs =
      MakeRuns(config, std::max(before, after));
  ASSERT_FALSE(runs.empty());
  for (const absl::Status& s :
       TrainRound(Pointers(runs, before), 1, steps_before)) {
    ASSERT_TRUE(IsReformAtStepBoundary(s)) << s;
  }
  ASSERT_EQ(runs[0]->committed_step(), steps_before);
  for (const absl::Status& s : TrainRound(Pointers(runs, after), 2, 0)) {
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_EQ(runs[0]->committed_step(), kSteps);
}

double ErrorBetween(const std::string& a, const std::string& b) {
  std::string worst;
  absl::StatusOr<double> error = MaxRelativeError(a, b, &worst);
  EXPECT_TRUE(error.ok()) << error.status();
  return error.ok() ? *error : 1.0;
}

class GlobalBatchTrainingTest : public ::testing::TestWithParam<bool> {
 protected:
  static std::string Path(const std::string& what) {
    return TempPath(absl::StrCat("global-batch-", what,
                                 GetParam() ? "-shuffled" : "", ".pt"));
  }
};

// World sizes 2 and 3 divide the 6 micro-batches evenly, 4 unevenly
// (2, 2, 1, 1), 7 leaves one rank with none.
TEST_P(GlobalBatchTrainingTest, EveryWorldSizeTrainsToTheOneRankResult) {
  const std::string one = Path("one-rank");
  TrainUninterrupted(Config(GetParam()), 1, one);
  for (int world : {2, 3, 4, 7}) {
    const std::string mine = Path(absl::StrCat(world, "-ranks"));
    TrainUninterrupted(Config(GetParam()), world, mine);
    EXPECT_LE(ErrorBetween(mine, one), 1e-9) << world << " ranks";
  }
}

TEST_P(GlobalBatchTrainingTest, AShrinkOrAGrowEndsAsTheUninterruptedRun) {
  const std::string reference = Path("three-ranks");
  TrainUninterrupted(Config(GetParam()), 3, reference);
  // Round 1 ends mid-epoch (step 9 of 24: epoch 1, after its third step).
  const std::string shrunk = Path("shrunk");
  TrainThroughAReform(Config(GetParam()), 3, 2, 9, shrunk);
  EXPECT_LE(ErrorBetween(shrunk, reference), 1e-9);
  const std::string grown = Path("grown");
  TrainThroughAReform(Config(GetParam()), 2, 3, 9, grown);
  EXPECT_LE(ErrorBetween(grown, reference), 1e-9);
}

// Micro-batches per rank in step 1 of `sample_log` (a line per
// micro-batch: round, step, epoch, rank, indices).
std::vector<int> StepOneShares(const std::string& sample_log, int world) {
  std::vector<int> shares(world, 0);
  std::ifstream in(sample_log);
  int64_t round, step, epoch;
  int rank;
  std::string indices;
  while (in >> round >> step >> epoch >> rank >> indices) {
    if (step == 1 && rank >= 0 && rank < world) ++shares[rank];
  }
  return shares;
}

// The coordinator's shares (Assignment.micro_batch_shares) set each rank's
// micro-batches; shares that do not fit the global batch fall back to the
// even division on every rank alike. Either way the result is the one-rank
// run's.
TEST_P(GlobalBatchTrainingTest, TheCoordinatorsSharesOrEvenOnesIfTheyDoNotFit) {
  const std::string one = Path("one-rank-shares");
  TrainUninterrupted(Config(GetParam()), 1, one);
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> cases = {
      {{4, 1, 1}, {4, 1, 1}},  // taken
      {{4, 4, 4}, {2, 2, 2}},  // 12 of 6 micro-batches: even
      {{6, 0}, {2, 2, 2}},     // shares for 2 ranks in a round of 3: even
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& [given, used] = cases[c];
    TrainerConfig config = Config(GetParam());
    config.save_params = Path(absl::StrCat("shares-", c));
    config.sample_log = TempPath(absl::StrCat("shares-", c, GetParam(), ".log"));
    std::remove(config.sample_log.c_str());
    std::vector<std::unique_ptr<TrainingRun>> runs = MakeRuns(config, 3);
    ASSERT_EQ(runs.size(), 3u);
    for (const absl::Status& s : TrainRound(Pointers(runs, 3), 1, 0, given)) {
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ(StepOneShares(config.sample_log, 3), used) << "case " << c;
    EXPECT_LE(ErrorBetween(config.save_params, one), 1e-9) << "case " << c;
  }
}

// The contrast: with the per-rank batch (no global batch), 2 and 3 ranks
// train on different batches and end apart.
TEST_P(GlobalBatchTrainingTest, WithoutItTheWorldSizeChangesTheResult) {
  TrainerConfig config = Config(GetParam());
  config.global_batch_size = 0;
  const std::string two = Path("per-rank-2");
  const std::string three = Path("per-rank-3");
  TrainUninterrupted(config, 2, two);
  TrainUninterrupted(config, 3, three);
  EXPECT_GT(ErrorBetween(two, three), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Orders, GlobalBatchTrainingTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Shuffled" : "InOrder";
                         });

TEST(GlobalBatchConfigTest, RefusesWhatItCannotKeepExact) {
  TrainerConfig config = Config(false);
  config.global_batch_size = 26;  // not a multiple of 4
  EXPECT_EQ(TrainingRun::Create(config).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = Config(false);
  config.accumulate = 2;
  EXPECT_EQ(TrainingRun::Create(config).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = Config(false);
  config.model.kind = "cnn_bn";
  config.sync_batchnorm = true;
  EXPECT_EQ(TrainingRun::Create(config).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = Config(false);
  config.global_batch_size = 152;  // more than the 150 samples
  absl::Status status = TrainingRun::Create(config).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("no whole global batch"), std::string::npos)
      << status;
}

// The test knobs that slow a rank down refuse values that mean nothing.
TEST(SlowStepConfigTest, RefusesASlowdownBelowOneAndANegativeStepSleep) {
  TrainerConfig config = Config(false);
  config.slowdown = 0.5;
  absl::Status status = TrainingRun::Create(config).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("slowdown"), std::string::npos) << status;
  config = Config(false);
  config.step_sleep = absl::Milliseconds(-1);
  status = TrainingRun::Create(config).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("step_sleep"), std::string::npos) << status;
}

}  // namespace
}  // namespace gradsync
