// gradsync's DDP against PyTorch's, on the same MLP, initial weights and
// per-rank batches: the fp16 and bf16 compression hooks (PyTorch 1.13's
// default_hooks), and uneven inputs against PyTorch's Join (ranks with 10, 7
// and 3 batches). PyTorch runs as Debian's python3-torch on Gloo
// (torch_reference.py); gradsync's ranks are threads joined by Gloo.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "tests/worker/ddp/state_compare.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/distributed_data_parallel.h"
#include "worker/ddp/torch_file.h"
#include "worker/ddp/uneven_inputs.h"

namespace gradsync {
namespace {

using testing::Child;
using testing::Runfile;
using testing::TempPath;

constexpr int64_t kIn = 20, kHidden = 16, kOut = 4, kBatch = 4;
constexpr double kLearningRate = 0.2;

torch::nn::Sequential Mlp() {
  namespace nn = torch::nn;
  return nn::Sequential({{"fc1", nn::Linear(kIn, kHidden)},
                         {"relu1", nn::ReLU()},
                         {"fc2", nn::Linear(kHidden, kHidden)},
                         {"relu2", nn::ReLU()},
                         {"fc3", nn::Linear(kHidden, kOut)}});
}

struct Batch {
  torch::Tensor x, y;
};

struct Case {
  std::string mode;  // as torch_reference.py takes it
  StateDict init;
  std::vector<std::vector<Batch>> batches;  // per rank
};

Case MakeCase(const std::string& mode, const std::vector<int>& counts) {
  Case c;
  c.mode = mode;
  torch::manual_seed(17);
  for (const auto& item : GetStateDict(*Mlp())) {
    c.init.insert(item.key(), item.value().detach().clone());
  }
  for (int n : counts) {
    std::vector<Batch> mine;
    for (int i = 0; i < n; ++i) {
      mine.push_back({torch::randn({kBatch, kIn}),
                      torch::randint(0, kOut, {kBatch}, torch::kInt64)});
    }
    c.batches.push_back(std::move(mine));
  }
  return c;
}

// PyTorch's training of `c`: rank 0's final state.
absl::StatusOr<StateDict> TrainWithPyTorch(const Case& c) {
  c10::impl::GenericDict spec(c10::StringType::get(), c10::AnyType::get());
  spec.insert("mode", c.mode);
  spec.insert("lr", kLearningRate);
  spec.insert("sizes", c10::List<int64_t>({kIn, kHidden, kOut}));
  c10::Dict<std::string, torch::Tensor> init;
  for (const auto& item : c.init) init.insert(item.key(), item.value());
  spec.insert("init", init);
  c10::impl::GenericList ranks(c10::AnyType::get());
  for (const auto& mine : c.batches) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const Batch& b : mine) {
      list.push_back(c10::ivalue::Tuple::create({b.x, b.y}));
    }
    ranks.push_back(list);
  }
  spec.insert("batches", ranks);
  const std::string spec_path = TempPath(c.mode + "_spec.pt");
  const std::string out = TempPath(c.mode + "_torch.pt");
  absl::Status written = WriteTorchFile(c10::IValue(spec), spec_path);
  if (!written.ok()) return written;
  Child python;
  if (!python.Start({"/usr/bin/python3",
                     Runfile("tests/worker/ddp/torch_reference.py"), spec_path,
                     out},
                    /*capture=*/true)) {
    return absl::InternalError("cannot start python3");
  }
  if (!testing::WaitAll({&python}, absl::Minutes(3)) || python.exit_code() != 0) {
    return absl::InternalError(python.describe());
  }
  return ReadStateDict(out);
}

// gradsync's training of `c`, with `hook` (if any) and, for the join modes,
// under UnevenInputs: rank 0's final state (all ranks' are checked equal).
StateDict TrainWithGradsync(const Case& c,
                            std::function<std::shared_ptr<CommHook>()> hook) {
  const int world = static_cast<int>(c.batches.size());
  std::vector<StateDict> states(world);
  RunGlooRanks(world, [&](int rank, Backend* backend) {
    auto model = Mlp();
    ASSERT_TRUE(LoadStateDict(*model, c.init).ok());
    auto ddp = DistributedDataParallel::Create(model, backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    if (hook) ASSERT_TRUE((*ddp)->RegisterCommHook(hook()).ok());
    std::unique_ptr<UnevenInputs> uneven;
    if (absl::StartsWith(c.mode, "join")) {
      UnevenInputsOptions options;
      options.divide_by_initial_world_size = c.mode == "join_initial";
      auto created = UnevenInputs::Create(ddp->get(), options);
      ASSERT_TRUE(created.ok()) << created.status();
      uneven = std::move(*created);
    }
    torch::optim::SGD sgd(model->parameters(), kLearningRate);
    for (const Batch& b : c.batches[rank]) {
      sgd.zero_grad();
      torch::nn::functional::cross_entropy((*ddp)->forward(b.x), b.y).backward();
      sgd.step();
    }
    if (uneven != nullptr) {
      absl::Status finished = uneven->Finish();
      ASSERT_TRUE(finished.ok()) << finished;
    }
    for (const auto& item : GetStateDict(*model)) {
      states[rank].insert(item.key(), item.value().detach().clone());
    }
  });
  for (int r = 1; r < world; ++r) {
    absl::StatusOr<double> same = MaxRelativeError(states[r], states[0]);
    EXPECT_TRUE(same.ok() && *same == 0) << "rank " << r << " ends elsewhere";
  }
  return states[0];
}

void ExpectSameTraining(const Case& c,
                        std::function<std::shared_ptr<CommHook>()> hook,
                        double tolerance) {
  torch::set_num_threads(1);
  absl::StatusOr<StateDict> theirs = TrainWithPyTorch(c);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  const StateDict ours = TrainWithGradsync(c, hook);
  std::string worst;
  absl::StatusOr<double> error = MaxRelativeError(ours, *theirs, &worst);
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_LE(*error, tolerance) << worst;
  // The training moved the weights well past that tolerance.
  absl::StatusOr<double> moved = MaxRelativeError(ours, c.init);
  ASSERT_TRUE(moved.ok());
  EXPECT_GT(*moved, 100 * tolerance);
}

TEST(TorchReferenceTest, Fp16CompressMatchesPyTorchsHook) {
  ExpectSameTraining(MakeCase("fp16", {8, 8}),
                     [] { return std::make_shared<CompressHook>(torch::kHalf); },
                     1e-5);
}

TEST(TorchReferenceTest, Bf16CompressMatchesPyTorchsHook) {
  ExpectSameTraining(
      MakeCase("bf16", {8, 8}),
      [] { return std::make_shared<CompressHook>(torch::kBFloat16); }, 1e-5);
}

// Ranks with 10, 7 and 3 batches: no hang, and PyTorch's Join result.
TEST(TorchReferenceTest, UnevenInputsMatchPyTorchsJoin) {
  ExpectSameTraining(MakeCase("join", {10, 7, 3}), nullptr, 1e-5);
}

TEST(TorchReferenceTest, UnevenInputsDividingByTheInitialWorldSizeMatchJoin) {
  ExpectSameTraining(MakeCase("join_initial", {3, 10, 7}), nullptr, 1e-5);
}

}  // namespace
}  // namespace gradsync
