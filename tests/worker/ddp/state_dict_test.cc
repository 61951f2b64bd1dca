// State dicts and parameter files: round trips, errors, the "module." prefix
// of DDP models, and interchange with Python's torch.save / torch.load and
// PyTorch's DistributedDataParallel (Debian's python3-torch, run as a
// subprocess).
#include "worker/ddp/state_dict.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "worker/ddp/distributed_data_parallel.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::kPythonLoad;
using testing::RunPython;
using testing::TempPath;

// As PyTorch would write it: nn.Sequential(OrderedDict(fc1=Linear(784, h),
// relu1=ReLU(), fc2=Linear(h, h), relu2=ReLU(), fc3=Linear(h, 10))).
torch::nn::Sequential Mlp(int hidden, uint64_t seed) {
  torch::manual_seed(seed);
  namespace nn = torch::nn;
  return nn::Sequential({{"fc1", nn::Linear(784, hidden)},
                         {"relu1", nn::ReLU()},
                         {"fc2", nn::Linear(hidden, hidden)},
                         {"relu2", nn::ReLU()},
                         {"fc3", nn::Linear(hidden, 10)}});
}

bool SameParameters(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  if (pa.size() != pb.size()) return false;
  for (const auto& item : pa) {
    if (!torch::equal(item.value(), pb[item.key()])) return false;
  }
  return true;
}

TEST(StateDictTest, RoundTrip) {
  auto saved = Mlp(8, 1);
  auto loaded = Mlp(8, 2);
  ASSERT_FALSE(SameParameters(*saved, *loaded));
  const std::string path = TempPath("roundtrip.pt");
  ASSERT_TRUE(SaveParameters(*saved, path).ok());
  ASSERT_TRUE(LoadParameters(*loaded, path).ok());
  EXPECT_TRUE(SameParameters(*saved, *loaded));
}

TEST(StateDictTest, PythonReadsWhatWeWriteAndViceVersa) {
  auto model = Mlp(8, 3);
  const std::string ours = TempPath("ours.pt");
  const std::string theirs = TempPath("theirs.pt");
  ASSERT_TRUE(SaveParameters(*model, ours).ok());
  // Python loads our dict, checks the names and a value, adds 1 to every
  // tensor and saves it back with torch.save.
  const std::string script = absl::StrCat(
      kPythonLoad,
      "d = load('", ours, "')\n",
      "assert isinstance(d, dict), type(d)\n"
      "assert sorted(d) == sorted(['fc1.weight', 'fc1.bias', 'fc2.weight',"
      " 'fc2.bias', 'fc3.weight', 'fc3.bias']), sorted(d)\n"
      "assert d['fc1.weight'].shape == (8, 784)\n"
      "assert abs(float(d['fc3.bias'][0]) - (",
      model->named_parameters()["fc3.bias"][0].item<float>(), ")) < 1e-6\n",
      "torch.save({k: v + 1 for k, v in d.items()}, '", theirs, "')\n");
  ASSERT_TRUE(RunPython("script", script)) << script;
  auto tensors = ReadStateDict(theirs);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(tensors->contains(item.key())) << item.key();
    EXPECT_TRUE(torch::allclose((*tensors)[item.key()], item.value() + 1))
        << item.key();
  }
}

TEST(StateDictTest, Errors) {
  auto model = Mlp(8, 4);
  EXPECT_EQ(LoadParameters(*model, TempPath("missing.pt")).code(),
            absl::StatusCode::kNotFound);

  const std::string garbage = TempPath("garbage.pt");
  std::ofstream(garbage) << "not a pickle";
  EXPECT_EQ(LoadParameters(*model, garbage).code(),
            absl::StatusCode::kDataLoss);

  const std::string wider = TempPath("wider.pt");
  ASSERT_TRUE(SaveParameters(*Mlp(9, 4), wider).ok());
  absl::Status shape = LoadParameters(*model, wider);
  EXPECT_EQ(shape.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(shape.message()), HasSubstr("'fc1.weight'"));

  torch::nn::Sequential other(
      {{"conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3))}});
  absl::Status names = LoadParameters(*other, wider);
  EXPECT_EQ(names.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(names.message()), HasSubstr("has no 'conv1.weight'"));

  // A state with an extra entry is refused, and nothing is loaded.
  auto before = Mlp(8, 5);
  StateDict extra = GetStateDict(*Mlp(8, 6));
  extra.insert("fc4.weight", torch::zeros({1}));
  absl::Status refused = LoadStateDict(*model, extra);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("'fc4.weight'"));
  EXPECT_FALSE(SameParameters(*model, *Mlp(8, 6)));
}

TEST(StateDictTest, PrefixIsDroppedOnlyWhenEveryNameHasIt) {
  StateDict all;
  all.insert("module.a", torch::zeros({1}));
  all.insert("module.b", torch::zeros({1}));
  EXPECT_EQ(ConsumePrefix(all, kDdpPrefix).keys(),
            (std::vector<std::string>{"a", "b"}));
  StateDict some;
  some.insert("module.a", torch::zeros({1}));
  some.insert("b", torch::zeros({1}));
  EXPECT_EQ(ConsumePrefix(some, kDdpPrefix).keys(),
            (std::vector<std::string>{"module.a", "b"}));
}

TEST(StateDictTest, DdpStateDictHasTheModulePrefixAndLoadsBothWays) {
  RunGlooRanks(1, [&](int, Backend* backend) {
    auto model = Mlp(8, 7);
    auto ddp = DistributedDataParallel::Create(model, backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    StateDict state = (*ddp)->state_dict();
    ASSERT_EQ(state.size(), 6u);
    EXPECT_TRUE(state.contains("module.fc1.weight"));
    EXPECT_TRUE(state["module.fc1.weight"].is_same(model->named_parameters()["fc1.weight"]));

    // A DDP model loads a plain module's state and a DDP state alike.
    auto other = Mlp(8, 8);
    ASSERT_TRUE((*ddp)->load_state_dict(GetStateDict(*other)).ok());
    EXPECT_TRUE(SameParameters(*model, *other));
    auto third = Mlp(8, 9);
    ASSERT_TRUE(LoadStateDict(*third, state).ok());  // "module." dropped
    EXPECT_TRUE(SameParameters(*third, *model));
  });
}

// Checkpoints written by PyTorch's DistributedDataParallel
// (torch.save(ddp.state_dict()): "module." names in an OrderedDict) load
// into a gradsync model, and gradsync's DDP state dict loads into PyTorch's
// DDP model and, prefix consumed, into the plain module.
TEST(StateDictTest, InterchangeWithPyTorchDdp) {
  const std::string theirs = TempPath("torch_ddp.pt");
  const std::string ours = TempPath("gradsync_ddp.pt");
  const std::string init = TempPath("torch_ddp_init");
  std::remove(init.c_str());
  const std::string prelude = absl::StrCat(
      "import collections, torch, torch.distributed as dist\n"
      "from torch import nn\n"
      "dist.init_process_group('gloo', init_method='file://", init,
      "', rank=0, world_size=1)\n"
      "torch.manual_seed(11)\n"
      "model = nn.Sequential(collections.OrderedDict(fc1=nn.Linear(784, 8), "
      "relu1=nn.ReLU(), fc2=nn.Linear(8, 8), relu2=nn.ReLU(), "
      "fc3=nn.Linear(8, 10)))\n"
      "ddp = nn.parallel.DistributedDataParallel(model)\n");
  ASSERT_TRUE(RunPython("script", absl::StrCat(prelude, "torch.save(ddp.state_dict(), '",
                                   theirs, "')\n")));
  auto model = Mlp(8, 12);
  absl::Status loaded = LoadParameters(*model, theirs);
  ASSERT_TRUE(loaded.ok()) << loaded;
  auto read = ReadStateDict(theirs);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->contains("module.fc2.bias"));
  EXPECT_TRUE(torch::equal(model->named_parameters()["fc2.bias"],
                           (*read)["module.fc2.bias"]));

  RunGlooRanks(1, [&](int, Backend* backend) {
    auto ddp = DistributedDataParallel::Create(model, backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(1);
    }
    ASSERT_TRUE(WriteStateDict((*ddp)->state_dict(), ours).ok());
  });
  std::remove(init.c_str());
  const std::string check = absl::StrCat(
      prelude, kPythonLoad, "ours = load('", ours, "')\n",
      "assert all(k.startswith('module.') for k in ours), list(ours)\n"
      "ddp.load_state_dict(ours)\n"
      "theirs = load('", theirs, "')\n"
      "for k, v in theirs.items():\n"
      "    assert torch.allclose(ddp.state_dict()[k], v + 1), k\n"
      "nn.modules.utils.consume_prefix_in_state_dict_if_present(ours, 'module.')\n"
      "model.load_state_dict(ours)\n");
  ASSERT_TRUE(RunPython("script", check)) << check;
}

}  // namespace
}  // namespace gradsync
