// The trainer's models: names and shapes as documented (and as PyTorch
// would name them), the resnets against torchvision's (Debian's
// python3-torchvision, run as a subprocess), and batch norms that
// ConvertSyncBatchNorm can swap.
#include "worker/trainer/models.h"

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/ddp/state_dict.h"
#include "worker/ddp/sync_batch_norm.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::RunPython;
using testing::TempPath;

torch::nn::Sequential Mlp(int hidden, uint64_t seed) {
  torch::manual_seed(seed);
  auto model = MakeModel({"mlp", hidden});
  EXPECT_TRUE(model.ok());
  return *model;
}

torch::nn::Sequential Make(const std::string& kind, uint64_t seed) {
  torch::manual_seed(seed);
  auto model = MakeModel({kind});
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

std::vector<std::string> ChildNames(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& child : module.named_children()) {
    names.push_back(child.key());
  }
  return names;
}

// Each entry's name and shape.
std::map<std::string, std::vector<int64_t>> Shapes(const StateDict& state) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : state) {
    shapes[item.key()] = item.value().sizes().vec();
  }
  return shapes;
}

TEST(ModelsTest, NamesAndShapesAsDocumented) {
  auto mlp = Mlp(16, 0);
  auto params = mlp->named_parameters();
  ASSERT_EQ(params.size(), 6u);
  EXPECT_EQ(params["fc1.weight"].sizes(), (std::vector<int64_t>{16, 784}));
  EXPECT_EQ(params["fc2.weight"].sizes(), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(params["fc3.weight"].sizes(), (std::vector<int64_t>{10, 16}));
  EXPECT_EQ(mlp->forward(torch::zeros({3, 1, 28, 28})).sizes(),
            (std::vector<int64_t>{3, 10}));

  auto cnn = MakeModel({"cnn", 32});
  ASSERT_TRUE(cnn.ok());
  EXPECT_EQ((*cnn)->named_parameters()["fc1.weight"].sizes(),
            (std::vector<int64_t>{32, 1568}));
  EXPECT_EQ((*cnn)->forward(torch::zeros({2, 1, 28, 28})).sizes(),
            (std::vector<int64_t>{2, 10}));

  EXPECT_EQ(MakeModel({"resnet", 8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModel({"mlp", 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelsTest, UnknownKindErrorListsTheKinds) {
  auto model = MakeModel({"resnet", 8});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("mlp, cnn, cnn_bn, resnet18, resnet50; got 'resnet'"));
}

// Values the mlp and cnn had at seed 11 before the other kinds were added:
// their initialization must not change, bit for bit.
TEST(ModelsTest, MlpAndCnnInitializeAsBefore) {
  auto sum = [](const torch::nn::Sequential& model) {
    double total = 0;
    for (const auto& p : model->parameters()) {
      total += p.to(torch::kFloat64).sum().item<double>();
    }
    return total;
  };
  torch::manual_seed(11);
  auto mlp = MakeModel({"mlp", 8});
  ASSERT_TRUE(mlp.ok());
  EXPECT_FLOAT_EQ((*mlp)->named_parameters()["fc3.weight"][0][0].item<float>(),
                  -0.314337432f);
  EXPECT_NEAR(sum(*mlp), -2.0912683506552412, 1e-9);
  torch::manual_seed(11);
  auto cnn = MakeModel({"cnn", 8});
  ASSERT_TRUE(cnn.ok());
  EXPECT_FLOAT_EQ((*cnn)->named_parameters()["fc2.weight"][0][0].item<float>(),
                  0.272085667f);
  EXPECT_NEAR(sum(*cnn), -2.9326042473190057, 1e-9);
}

TEST(ModelsTest, CnnBnHasItsNormsBeforeTheRelus) {
  auto model = MakeModel({"cnn_bn", 24});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(ChildNames(**model),
              ElementsAre("conv1", "bn1", "relu1", "pool1", "conv2", "bn2",
                          "relu2", "pool2", "flatten", "fc1", "bn3", "relu3",
                          "fc2"));
  auto children = (*model)->named_children();
  EXPECT_NE(children["bn1"]->as<torch::nn::BatchNorm2dImpl>(), nullptr);
  EXPECT_NE(children["bn2"]->as<torch::nn::BatchNorm2dImpl>(), nullptr);
  EXPECT_NE(children["bn3"]->as<torch::nn::BatchNorm1dImpl>(), nullptr);
  auto params = (*model)->named_parameters();
  EXPECT_EQ(params["bn2.weight"].sizes(), (std::vector<int64_t>{32}));
  EXPECT_EQ(params["bn3.weight"].sizes(), (std::vector<int64_t>{24}));
  EXPECT_EQ((*model)->forward(torch::rand({4, 1, 28, 28})).sizes(),
            (std::vector<int64_t>{4, 10}));
}

TEST(ModelsTest, InputShapes) {
  for (const char* kind : {"mlp", "cnn", "cnn_bn"}) {
    EXPECT_EQ(ModelInputShape({kind}), (std::vector<int64_t>{1, 28, 28}))
        << kind;
  }
  for (const char* kind : {"resnet18", "resnet50"}) {
    EXPECT_EQ(ModelInputShape({kind}), (std::vector<int64_t>{3, 32, 32}))
        << kind;
  }
  EXPECT_TRUE(ModelInputShape({"resnet"}).empty());
}

TEST(ModelsTest, ResNetsHaveTorchvisionsChildren) {
  auto model = Make("resnet50", 0);
  EXPECT_THAT(ChildNames(*model),
              ElementsAre("conv1", "bn1", "relu", "maxpool", "layer1",
                          "layer2", "layer3", "layer4", "avgpool", "flatten",
                          "fc"));
  EXPECT_THAT(ChildNames(*model->named_children()["layer2"]),
              ElementsAre("0", "1", "2", "3"));
}

// Torchvision's model `kind` (resnet18 or resnet50) with non-trivial batch
// norms, its weights loaded into ours: the same output in eval mode.
void ExpectComputesAsTorchvision(const std::string& kind) {
  SCOPED_TRACE(kind);
  const std::string weights = TempPath(kind + ".pt");
  const std::string io = TempPath(kind + "_io.pt");
  const std::string script = absl::StrCat(
      "import torch, torchvision\n"
      "torch.manual_seed(0)\n"
      "model = torchvision.models.", kind, "(num_classes=10)\n",
      "for m in model.modules():\n"
      "    if isinstance(m, torch.nn.BatchNorm2d):\n"
      "        m.weight.data.uniform_(0.5, 1.5)\n"
      "        m.bias.data.uniform_(-0.5, 0.5)\n"
      "        m.running_mean.uniform_(-0.5, 0.5)\n"
      "        m.running_var.uniform_(0.5, 1.5)\n"
      "model.eval()\n"
      "x = torch.rand(2, 3, 32, 32)\n"
      "with torch.no_grad():\n"
      "    y = model(x)\n"
      "torch.save(model.state_dict(), '", weights, "')\n"
      "torch.save({'input': x, 'output': y}, '", io, "')\n");
  ASSERT_TRUE(RunPython(kind, script)) << script;
  auto model = Make(kind, 1);
  const absl::Status loaded = LoadParameters(*model, weights);
  ASSERT_TRUE(loaded.ok()) << loaded;
  auto expected = ReadStateDict(io);
  ASSERT_TRUE(expected.ok()) << expected.status();
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor output = model->forward((*expected)["input"]);
  EXPECT_TRUE(torch::allclose(output, (*expected)["output"], 1e-4, 1e-5))
      << output << "\n" << (*expected)["output"];
}

TEST(ModelsTest, ResNet18ComputesAsTorchvisions) {
  ExpectComputesAsTorchvision("resnet18");
}

// Also pins the Bottleneck's stride on its 3x3 conv, which the shapes do
// not show.
TEST(ModelsTest, ResNet50ComputesAsTorchvisions) {
  ExpectComputesAsTorchvision("resnet50");
}

TEST(ModelsTest, ResNet50StateDictIsTorchvisions) {
  const std::string weights = TempPath("resnet50.pt");
  const std::string script = absl::StrCat(
      "import torch, torchvision\n"
      "model = torchvision.models.resnet50(num_classes=10)\n"
      "torch.save(model.state_dict(), '", weights, "')\n");
  ASSERT_TRUE(RunPython("resnet50", script)) << script;
  auto theirs = ReadStateDict(weights);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  auto model = Make("resnet50", 0);
  EXPECT_EQ(Shapes(GetStateDict(*model)), Shapes(*theirs));
}

// Conversion touches every batch norm, including the blocks' (reached by
// name) and the downsamples', and computes as before.
TEST(ModelsTest, ResNet18ConvertsToSyncBatchNorm) {
  auto model = Make("resnet18", 2);
  const torch::Tensor x = torch::rand({4, 3, 32, 32});
  model->forward(x);  // training mode: running statistics move off 0 and 1
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor before = model->forward(x);
  auto converted = ConvertSyncBatchNorm(model.ptr());
  ASSERT_TRUE(converted.ok()) << converted.status();
  EXPECT_EQ(converted->get(), model.ptr().get());
  for (const auto& module : model->modules()) {
    EXPECT_EQ(module->as<torch::nn::BatchNorm2dImpl>(), nullptr)
        << module->name();
  }
  // 1 in the stem, 2 in each of the 8 blocks, 1 in each of 3 downsamples.
  EXPECT_EQ(FindSyncBatchNorms(*model).size(), 20u);
  EXPECT_TRUE(torch::allclose(model->forward(x), before, 1e-5, 1e-6));
}

}  // namespace
}  // namespace gradsync
