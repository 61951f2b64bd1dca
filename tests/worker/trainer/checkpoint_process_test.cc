// Checkpoints with real gradsync-worker processes: every process of a job
// dies after step 12 (a failpoint), the job is started again with --resume,
// goes on from the checkpoint of step 10 and ends with exactly the
// parameters of a run that was never interrupted; Python's torch.load reads
// the checkpoints.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/ddp/state_compare.h"
#include "worker/ddp/checkpoint.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::kPythonLoad;
using ::gradsync::testing::RunPython;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::TempPath;
using ::gradsync::testing::WaitAll;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(120);

class CheckpointProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(coordinator_.Start(Runfile("server/gradsync-coordinator"),
                                   "checkpoint_process_test"));
  }
  void TearDown() override { EXPECT_TRUE(coordinator_.Stop()); }

  // Runs `world` workers of `job` with the common flags and `extra` until
  // they exit; their exit codes.
  std::vector<int> Run(const std::string& job, int world,
                       const std::vector<std::string>& extra,
                       std::vector<std::unique_ptr<Child>>* children) {
    for (int i = 0; i < world; ++i) {
      std::vector<std::string> argv = {
          Runfile("worker/gradsync-worker"),
          absl::StrCat("--coordinator=", coordinator_.address()),
          absl::StrCat("--job=", job), "--nnodes=1",
          absl::StrCat("--nproc_per_node=", world), "--timeout=20s",
          "--join_timeout=60s", "--model=cnn_bn", "--sync_batchnorm",
          "--hidden=16", "--synthetic_size=64", "--batch_size=4", "--steps=20",
          "--lr=0.05", "--momentum=0.9", "--shuffle", "--seed=3",
          "--log_every=0"};
      argv.insert(argv.end(), extra.begin(), extra.end());
      children->push_back(std::make_unique<Child>());
      EXPECT_TRUE(children->back()->Start(argv, /*capture=*/true));
    }
    std::vector<Child*> pointers;
    for (const auto& c : *children) pointers.push_back(c.get());
    EXPECT_TRUE(WaitAll(pointers, kBound));
    std::vector<int> codes;
    for (const auto& c : *children) codes.push_back(c->exit_code());
    return codes;
  }

  CoordinatorProcess coordinator_;
};

TEST_F(CheckpointProcessTest, AJobKilledWholeResumesToTheSameParameters) {
  const std::string dir = TempPath("checkpoints");
  const std::string resumed = TempPath("resumed.pt");
  const std::string uninterrupted = TempPath("uninterrupted.pt");
  const std::vector<std::string> checkpoints = {
      absl::StrCat("--checkpoint_dir=", dir), "--checkpoint_every=5"};

  // Every process dies right after committing step 12.
  std::vector<std::unique_ptr<Child>> killed;
  std::vector<std::string> flags = checkpoints;
  flags.push_back("--failpoint=step:12");
  EXPECT_THAT(Run("resume", 2, flags, &killed),
              ElementsAre(kFailpointExitCode, kFailpointExitCode));
  absl::StatusOr<CheckpointDir> folder = CheckpointDir::Open(dir, 3);
  ASSERT_TRUE(folder.ok());
  EXPECT_THAT(folder->List(), ElementsAre(dir + "/checkpoint-5.pt",
                                          dir + "/checkpoint-10.pt"));

  // Started again, the same job goes on from step 10.
  std::vector<std::unique_ptr<Child>> again;
  flags = checkpoints;
  flags.insert(flags.end(), {"--resume", absl::StrCat("--save_params=", resumed)});
  EXPECT_THAT(Run("resume", 2, flags, &again), ElementsAre(0, 0));
  for (const auto& c : again) {
    EXPECT_THAT(c->err(), HasSubstr("resumed from the checkpoint of step 10"))
        << c->describe();
  }
  EXPECT_THAT(folder->List(),
              ElementsAre(dir + "/checkpoint-10.pt", dir + "/checkpoint-15.pt",
                          dir + "/checkpoint-20.pt"));

  // A run never interrupted (--resume with no checkpoint starts at 0).
  std::vector<std::unique_ptr<Child>> whole;
  EXPECT_THAT(
      Run("whole", 2,
          {absl::StrCat("--checkpoint_dir=", TempPath("none")), "--resume",
           absl::StrCat("--save_params=", uninterrupted)},
          &whole),
      ElementsAre(0, 0));
  EXPECT_THAT(whole[0]->err(), HasSubstr("no checkpoint in"));

  std::string worst;
  absl::StatusOr<double> error = MaxRelativeError(resumed, uninterrupted, &worst);
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(*error, 0) << worst;

  // Python reads the last checkpoint: the model of the saved parameters.
  ASSERT_TRUE(RunPython("read_checkpoint", absl::StrCat(
      kPythonLoad,
      "c = load('", dir, "/checkpoint-20.pt')\n",
      "p = load('", resumed, "')\n",
      "assert c['step'] == 20, c['step']\n"
      "assert sorted(c['model']) == sorted(p), (sorted(c['model']), sorted(p))\n"
      "assert all(torch.equal(c['model'][k], p[k]) for k in p)\n"
      "assert 'momentum_buffer' in c['optimizer']['state'][0]\n"
      "assert c['optimizer']['param_groups'][0]['momentum'] == 0.9\n")));
}

}  // namespace
}  // namespace gradsync
