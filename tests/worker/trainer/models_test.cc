// The trainer's models: names and shapes as documented (and as PyTorch
// would name them).
#include "worker/trainer/models.h"

#include <torch/torch.h>

#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

torch::nn::Sequential Mlp(int hidden, uint64_t seed) {
  torch::manual_seed(seed);
  auto model = MakeModel({"mlp", hidden});
  EXPECT_TRUE(model.ok());
  return *model;
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
