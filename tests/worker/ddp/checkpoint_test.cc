// Checkpoints: a restored run continues exactly as the uninterrupted one;
// PyTorch loads our checkpoints into its own model and optimizer (and we
// load what it saves) and the next step agrees; a folder keeps the newest
// few and skips a damaged one; a mismatched optimizer changes nothing.
#include "worker/ddp/checkpoint.h"

#include <torch/torch.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/ddp/state_compare.h"
#include "worker/ddp/torch_file.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::kPythonLoad;
using testing::RunPython;
using testing::TempPath;

torch::nn::Sequential Model(uint64_t seed) {
  torch::manual_seed(seed);
  namespace nn = torch::nn;
  return nn::Sequential({{"fc1", nn::Linear(5, 6)},
                         {"bn", nn::BatchNorm1d(6)},
                         {"relu", nn::ReLU()},
                         {"fc2", nn::Linear(6, 3)}});
}

// The Python model of the same names.
constexpr char kPythonModel[] =
    "import collections, torch\n"
    "from torch import nn\n"
    "model = nn.Sequential(collections.OrderedDict(fc1=nn.Linear(5, 6), "
    "bn=nn.BatchNorm1d(6), relu=nn.ReLU(), fc2=nn.Linear(6, 3)))\n";

// One step on inputs drawn from the global generator (so the RNG state
// matters) and a fixed target.
void Step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer) {
  torch::Tensor x = torch::randn({8, 5});
  torch::Tensor y = torch::arange(8, torch::kInt64) % 3;
  optimizer.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  optimizer.step();
}

StateDict Copy(const torch::nn::Module& module) {
  StateDict copy;
  for (const auto& item : GetStateDict(module)) copy.insert(item.key(), item.value().clone());
  return copy;
}

template <typename Optimizer, typename Options>
void ExpectResumeIsExact(Options options) {
  auto model = Model(1);
  Optimizer optimizer(model->parameters(), options);
  torch::manual_seed(2);
  for (int s = 0; s < 3; ++s) Step(model, optimizer);
  absl::StatusOr<Checkpoint> saved =
      CaptureCheckpoint(*model, optimizer, 3, {{"epoch", 1}});
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::string path = TempPath("exact.pt");
  ASSERT_TRUE(WriteCheckpoint(*saved, path).ok());
  for (int s = 0; s < 3; ++s) Step(model, optimizer);  // uninterrupted

  auto resumed = Model(9);
  Optimizer fresh(resumed->parameters(), options);
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 3);
  EXPECT_EQ(read->counters.at("epoch"), 1);
  ASSERT_TRUE(RestoreCheckpoint(*read, *resumed, fresh).ok());
  for (int s = 0; s < 3; ++s) Step(resumed, fresh);
  absl::StatusOr<double> error = MaxRelativeError(GetStateDict(*resumed), GetStateDict(*model));
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(*error, 0);
}

TEST(CheckpointTest, ResumingIsExactForSgdWithMomentum) {
  ExpectResumeIsExact<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9));
}

TEST(CheckpointTest, ResumingIsExactForAdam) {
  ExpectResumeIsExact<torch::optim::Adam>(torch::optim::AdamOptions(0.01).amsgrad(true));
}

// Our checkpoint into PyTorch's model and optimizer, one more step there and
// here on the same data: the same parameters. Then PyTorch's own checkpoint
// (its model.state_dict() and optimizer.state_dict()) back into ours.
TEST(CheckpointTest, PyTorchLoadsOurCheckpointsAndWeLoadTheirs) {
  auto model = Model(3);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
  torch::manual_seed(4);
  for (int s = 0; s < 2; ++s) Step(model, optimizer);
  absl::StatusOr<Checkpoint> saved = CaptureCheckpoint(*model, optimizer, 2, {});
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::string ours = TempPath("ours.pt");
  const std::string data = TempPath("data.pt");
  const std::string theirs = TempPath("theirs.pt");
  ASSERT_TRUE(WriteCheckpoint(*saved, ours).ok());
  torch::Tensor x = torch::randn({8, 5});
  torch::Tensor y = torch::arange(8, torch::kInt64) % 3;
  c10::Dict<std::string, torch::Tensor> batch;
  batch.insert("x", x);
  batch.insert("y", y);
  ASSERT_TRUE(WriteTorchFile(c10::IValue(batch), data).ok());

  ASSERT_TRUE(RunPython("resume_in_python", absl::StrCat(
      kPythonModel, kPythonLoad,
      "ckpt = load('", ours, "')\n",
      "assert ckpt['format'] == 'gradsync-checkpoint/1' and ckpt['step'] == 2\n"
      "model.load_state_dict(ckpt['model'])\n"
      "opt = torch.optim.SGD(model.parameters(), lr=1.0)\n"
      "opt.load_state_dict(ckpt['optimizer'])\n"
      "assert opt.param_groups[0]['lr'] == 0.05, opt.param_groups\n"
      "assert opt.param_groups[0]['momentum'] == 0.9\n"
      "torch.set_rng_state(ckpt['rng_state'])\n"
      "batch = load('", data, "')\n",
      "opt.zero_grad()\n"
      "torch.nn.functional.cross_entropy(model(batch['x']), batch['y']).backward()\n"
      "opt.step()\n"
      "torch.save({'format': 'gradsync-checkpoint/1', 'step': 3, "
      "'model': model.state_dict(), 'optimizer': opt.state_dict(), "
      "'counters': {}}, '", theirs, "')\n")));

  optimizer.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  optimizer.step();
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(theirs);
  ASSERT_TRUE(read.ok()) << read.status();
  auto loaded = Model(5);
  torch::optim::SGD fresh(loaded->parameters(), torch::optim::SGDOptions(1.0));
  ASSERT_TRUE(RestoreCheckpoint(*read, *loaded, fresh).ok());
  absl::StatusOr<double> error = MaxRelativeError(GetStateDict(*loaded), GetStateDict(*model));
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_LE(*error, 1e-6);
  EXPECT_DOUBLE_EQ(
      static_cast<torch::optim::SGDOptions&>(fresh.param_groups()[0].options()).lr(),
      0.05);
  // The momentum came along: the next step agrees too.
  torch::manual_seed(6);
  Step(model, optimizer);
  torch::manual_seed(6);
  Step(loaded, fresh);
  error = MaxRelativeError(GetStateDict(*loaded), GetStateDict(*model));
  ASSERT_TRUE(error.ok());
  EXPECT_LE(*error, 1e-6);
}

TEST(CheckpointTest, AFolderKeepsTheNewestAndSkipsADamagedOne) {
  const std::string dir = TempPath("ckpts/nested");
  absl::StatusOr<CheckpointDir> folder = CheckpointDir::Open(dir, 2);
  ASSERT_TRUE(folder.ok()) << folder.status();
  auto model = Model(7);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  for (int64_t step : {5, 10, 15}) {
    absl::StatusOr<Checkpoint> c = CaptureCheckpoint(*model, optimizer, step, {});
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(folder->Save(*c).ok());
  }
  EXPECT_THAT(folder->List(), ElementsAre(dir + "/checkpoint-10.pt",
                                          dir + "/checkpoint-15.pt"));
  std::ofstream(dir + "/checkpoint-15.pt", std::ios::trunc) << "torn";
  absl::StatusOr<std::optional<Checkpoint>> latest = folder->LoadLatest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->step, 10);

  absl::StatusOr<CheckpointDir> empty = CheckpointDir::Open(TempPath("none"), 1);
  ASSERT_TRUE(empty.ok());
  latest = empty->LoadLatest();
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());
  EXPECT_EQ(CheckpointDir::Open(dir, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointTest, AMismatchedOptimizerIsRefusedAndChangesNothing) {
  auto model = Model(8);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
  torch::manual_seed(1);
  Step(model, optimizer);
  absl::StatusOr<Checkpoint> saved = CaptureCheckpoint(*model, optimizer, 1, {});
  ASSERT_TRUE(saved.ok());

  auto other = Model(9);
  const StateDict before = Copy(*other);
  // Fewer parameters in the optimizer than in the checkpoint's group.
  torch::optim::SGD partial(std::vector<torch::Tensor>{other->parameters()[0]}, 0.1);
  absl::Status status = RestoreCheckpoint(*saved, *other, partial);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("param group 0"));
  absl::StatusOr<double> unchanged = MaxRelativeError(GetStateDict(*other), before);
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(*unchanged, 0);

  torch::optim::Adam adam(other->parameters(), 0.1);
  EXPECT_EQ(RestoreCheckpoint(*saved, *other, adam).code(),
            absl::StatusCode::kFailedPrecondition);
  torch::optim::RMSprop rmsprop(other->parameters(), 0.1);
  EXPECT_EQ(CaptureCheckpoint(*other, rmsprop, 0, {}).status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace gradsync
