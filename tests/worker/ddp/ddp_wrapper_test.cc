// DistributedDataParallel's surface as PyTorch users know it: ddp(x), the
// module and its parameters, devices, and no silent failure when the loop
// calls the module directly. Ranks are threads joined by Gloo.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "worker/ddp/distributed_data_parallel.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

torch::nn::Sequential Model() {
  torch::manual_seed(4);
  namespace nn = torch::nn;
  return nn::Sequential({{"fc1", nn::Linear(6, 8)},
                         {"relu", nn::ReLU()},
                         {"fc2", nn::Linear(8, 3)}});
}

// Rank r's input: r + 1 everywhere.
torch::Tensor Input(int rank) { return torch::full({4, 6}, rank + 1.0); }

TEST(DdpWrapperTest, ForwardRunsTheModuleAndTheBackwardAveragesGradients) {
  std::vector<torch::Tensor> grads(2);
  torch::Tensor expected_grad;
  {
    // One process: the mean of both ranks' losses.
    auto model = Model();
    torch::Tensor loss = (model->forward(Input(0)).sum() +
                          model->forward(Input(1)).sum()) / 2;
    loss.backward();
    expected_grad = model->named_parameters()["fc1.weight"].grad().clone();
  }
  auto models = ModelsForRanks(2, Model);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    auto model = models[rank];
    auto ddp = DistributedDataParallel::Create(model, backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    torch::Tensor output = (**ddp)(Input(rank));  // PyTorch's ddp(x)
    EXPECT_TRUE(torch::equal(output, model->forward(Input(rank))));
    output.sum().backward();
    grads[rank] = (*ddp)->named_parameters()["fc1.weight"].grad().clone();
    EXPECT_EQ(&(*ddp)->module(), model.ptr().get());
    EXPECT_EQ((*ddp)->parameters().size(), model->parameters().size());
  });
  EXPECT_TRUE(torch::allclose(grads[0], expected_grad, 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));
}

// The silent failure PyTorch users meet: calling the module instead of the
// wrapper trains each rank on its own gradients. Here backward fails, naming
// the parameter and the fix, on the first step and after a proper one.
TEST(DdpWrapperTest, ABackwardNoForwardThroughTheWrapperPreparedFailsLoudly) {
  std::vector<std::string> first(2), later(2);
  auto models = ModelsForRanks(2, Model);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    auto model = models[rank];
    auto ddp = DistributedDataParallel::Create(model, backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    try {
      model->forward(Input(rank)).sum().backward();
    } catch (const c10::Error& e) {
      first[rank] = e.what_without_backtrace();
    }
    // A proper step works, and the next direct call fails again.
    (*ddp)->forward(Input(rank)).sum().backward();
    try {
      model->forward(Input(rank)).sum().backward();
    } catch (const c10::Error& e) {
      later[rank] = e.what_without_backtrace();
    }
    // Local accumulation goes through the wrapper too.
    {
      auto no_sync = (*ddp)->NoSync();
      (*ddp)->forward(Input(rank)).sum().backward();
    }
    (*ddp)->forward(Input(rank)).sum().backward();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(first[r], HasSubstr("no forward pass through the DDP wrapper"));
    EXPECT_THAT(first[r], HasSubstr("ddp->forward(input)"));
    EXPECT_THAT(first[r], HasSubstr("fc"));
    EXPECT_THAT(later[r], HasSubstr("no forward pass through the DDP wrapper"));
  }
}

TEST(DdpWrapperTest, DeviceOptionsAreCheckedAndApplied) {
  auto model = Model();
  RunGlooRanks(1, [&](int, Backend* backend) {
    DdpOptions two;
    two.device_ids = {torch::Device(torch::kCPU), torch::Device(torch::kCPU)};
    absl::Status status = DistributedDataParallel::Create(model, backend, two).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("one device per process"));

    DdpOptions one;
    one.device_ids = {torch::Device(torch::kCPU)};
    one.output_device = torch::Device(torch::kCPU);
    auto ddp = DistributedDataParallel::Create(model, backend, one);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    EXPECT_TRUE((*ddp)->forward(Input(0)).device().is_cpu());
  });
}

// A module wrapped as a plain torch::nn::Module has no forward the wrapper
// knows: forward(x) says what to do; Forward(fn) still works.
TEST(DdpWrapperTest, ForwardOfAnUntypedModuleExplainsItself) {
  auto model = Model();
  RunGlooRanks(1, [&](int, Backend* backend) {
    std::shared_ptr<torch::nn::Module> untyped = model.ptr();
    auto ddp = DistributedDataParallel::Create(untyped, backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    try {
      (*ddp)->forward(Input(0));
      ADD_FAILURE() << "forward of an untyped module ran";
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what_without_backtrace(), HasSubstr("Forward("));
    }
    (*ddp)->Forward([&] { return model->forward(Input(0)); }).sum().backward();
  });
}

}  // namespace
}  // namespace gradsync
