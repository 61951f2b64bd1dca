// Parameter files: round trips, errors, and interchange with Python's
// torch.save / torch.load (Debian's python3-torch, run as a subprocess).
#include "worker/trainer/params_io.h"

#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer/models.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

torch::nn::Sequential Mlp(int hidden, uint64_t seed) {
  torch::manual_seed(seed);
  auto model = MakeModel({"mlp", hidden});
  EXPECT_TRUE(model.ok());
  return *model;
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

// Runs Debian's Python with torch; the test needs it (install_deps.sh
// installs python3-torch).
int RunPython(const std::string& script) {
  const std::string path = TempPath("script.py");
  std::ofstream(path) << script;
  return std::system(absl::StrCat("/usr/bin/python3 ", path).c_str());
}

TEST(ParamsIoTest, RoundTrip) {
  auto saved = Mlp(8, 1);
  auto loaded = Mlp(8, 2);
  ASSERT_FALSE(SameParameters(*saved, *loaded));
  const std::string path = TempPath("roundtrip.pt");
  ASSERT_TRUE(SaveParameters(*saved, path).ok());
  ASSERT_TRUE(LoadParameters(*loaded, path).ok());
  EXPECT_TRUE(SameParameters(*saved, *loaded));
}

TEST(ParamsIoTest, PythonReadsWhatWeWriteAndViceVersa) {
  auto model = Mlp(8, 3);
  const std::string ours = TempPath("ours.pt");
  const std::string theirs = TempPath("theirs.pt");
  ASSERT_TRUE(SaveParameters(*model, ours).ok());
  // Python loads our dict, checks the names and a value, adds 1 to every
  // tensor and saves it back with torch.save.
  const std::string script = absl::StrCat(
      "import torch\n"
      "d = torch.load('", ours, "')\n",
      "assert isinstance(d, dict), type(d)\n"
      "assert sorted(d) == sorted(['fc1.weight', 'fc1.bias', 'fc2.weight',"
      " 'fc2.bias', 'fc3.weight', 'fc3.bias']), sorted(d)\n"
      "assert d['fc1.weight'].shape == (8, 784)\n"
      "assert abs(float(d['fc3.bias'][0]) - (",
      model->named_parameters()["fc3.bias"][0].item<float>(), ")) < 1e-6\n",
      "torch.save({k: v + 1 for k, v in d.items()}, '", theirs, "')\n");
  ASSERT_EQ(RunPython(script), 0) << script;
  auto tensors = ReadParameters(theirs);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(tensors->count(item.key())) << item.key();
    EXPECT_TRUE(torch::allclose(tensors->at(item.key()), item.value() + 1))
        << item.key();
  }
}

TEST(ParamsIoTest, Errors) {
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

  auto cnn = MakeModel({"cnn", 8});
  ASSERT_TRUE(cnn.ok());
  absl::Status names = LoadParameters(**cnn, wider);
  EXPECT_EQ(names.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(names.message()), HasSubstr("has no 'conv1.weight'"));
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

}  // namespace
}  // namespace gradsync
