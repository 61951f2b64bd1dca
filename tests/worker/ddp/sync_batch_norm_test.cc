// SyncBatchNorm against the arithmetic it promises: W ranks training on
// their shards (of equal or unequal sizes) end with the parameters and
// running statistics of one process running plain BatchNorm on the whole
// batch; without the conversion they do not. And ConvertSyncBatchNorm's
// rules: in place in Sequentials, the same tensors, all or nothing. Ranks
// are threads joined by Gloo.
#include "worker/ddp/sync_batch_norm.h"

#include <torch/torch.h>

#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "tests/worker/ddp/state_compare.h"
#include "worker/backend/observed_backend.h"
#include "worker/ddp/distributed_data_parallel.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 4;
constexpr double kLearningRate = 0.1;

// conv -> BatchNorm2d -> relu -> fc1 -> BatchNorm1d -> relu -> fc2, on
// [N, 3, 6, 6] inputs, 3 classes.
torch::nn::Sequential Model() {
  torch::manual_seed(21);
  namespace nn = torch::nn;
  return nn::Sequential(
      {{"conv", nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1))},
       {"bn1", nn::BatchNorm2d(4)},
       {"relu1", nn::ReLU()},
       {"flatten", nn::Flatten()},
       {"fc1", nn::Linear(4 * 6 * 6, 8)},
       {"bn2", nn::BatchNorm1d(nn::BatchNormOptions(8).momentum(0.3))},
       {"relu2", nn::ReLU()},
       {"fc2", nn::Linear(8, 3)}});
}

struct Shard {
  torch::Tensor x, y;
};

// data[step][rank]: each rank's samples of each step.
std::vector<std::vector<Shard>> MakeData(const std::vector<int>& batches) {
  torch::manual_seed(5);
  std::vector<std::vector<Shard>> data(kSteps);
  for (auto& step : data) {
    for (int b : batches) {
      step.push_back({torch::randn({b, 3, 6, 6}) * 2 + 1,
                      torch::randint(0, 3, {b}, torch::kInt64)});
    }
  }
  return data;
}

// One process, plain BatchNorm over every rank's samples at once; the loss
// is the mean over ranks of each rank's mean loss, which is what DDP's
// gradient averaging computes.
StateDict TrainReference(const std::vector<std::vector<Shard>>& data) {
  auto model = Model();
  torch::optim::SGD sgd(model->parameters(), kLearningRate);
  for (const auto& step : data) {
    std::vector<torch::Tensor> xs;
    for (const Shard& s : step) xs.push_back(s.x);
    torch::Tensor out = model->forward(torch::cat(xs));
    torch::Tensor loss = torch::zeros({});
    int64_t at = 0;
    for (const Shard& s : step) {
      loss = loss + torch::nn::functional::cross_entropy(
                        out.narrow(0, at, s.x.size(0)), s.y);
      at += s.x.size(0);
    }
    sgd.zero_grad();
    (loss / static_cast<double>(step.size())).backward();
    sgd.step();
  }
  return GetStateDict(*model);
}

// W ranks with DDP, their layers converted to SyncBatchNorm or not; rank
// 0's state.
StateDict TrainDistributed(const std::vector<std::vector<Shard>>& data,
                           bool convert) {
  const int world = static_cast<int>(data.front().size());
  std::vector<StateDict> states(world);
  auto models = ModelsForRanks(world, Model);
  RunGlooRanks(world, [&](int rank, Backend* backend) {
    auto model = models[rank];
    if (convert) ASSERT_TRUE(ConvertSyncBatchNorm(model.ptr()).ok());
    auto ddp = DistributedDataParallel::Create(model, backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    torch::optim::SGD sgd(model->parameters(), kLearningRate);
    for (const auto& step : data) {
      const Shard& mine = step[rank];
      sgd.zero_grad();
      torch::nn::functional::cross_entropy((*ddp)->forward(mine.x), mine.y)
          .backward();
      sgd.step();
    }
    StateDict copy;
    for (const auto& item : GetStateDict(*model)) {
      copy.insert(item.key(), item.value().detach().clone());
    }
    states[rank] = copy;
  });
  // Synchronized statistics are the same on every rank; plain BatchNorm's
  // running statistics are each rank's own.
  for (int r = 1; r < world && convert; ++r) {
    absl::StatusOr<double> same = MaxRelativeError(states[r], states[0]);
    EXPECT_TRUE(same.ok() && *same == 0) << "rank " << r << " differs";
  }
  return states[0];
}

class SyncBatchNormEquivalenceTest
    : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(SyncBatchNormEquivalenceTest, MatchesOneProcessOnTheWholeBatch) {
  torch::set_num_threads(1);
  const auto data = MakeData(GetParam());
  const StateDict expected = TrainReference(data);
  std::string worst;
  absl::StatusOr<double> error =
      MaxRelativeError(TrainDistributed(data, /*convert=*/true), expected, &worst);
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_LE(*error, 1e-5) << worst;
  // The running statistics are part of that comparison; they moved.
  EXPECT_GT(expected["bn1.running_var"].sub(1).abs().max().item<double>(), 1e-2);
  EXPECT_EQ(expected["bn2.num_batches_tracked"].item<int64_t>(), kSteps);

  // Plain BatchNorm under DDP normalizes each rank's shard by its own
  // statistics: not the same training.
  absl::StatusOr<double> unconverted =
      MaxRelativeError(TrainDistributed(data, /*convert=*/false), expected);
  ASSERT_TRUE(unconverted.ok()) << unconverted.status();
  EXPECT_GT(*unconverted, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Batches, SyncBatchNormEquivalenceTest,
    ::testing::Values(std::vector<int>{4, 4}, std::vector<int>{4, 4, 4},
                      std::vector<int>{2, 7}, std::vector<int>{5, 2, 3}),
    [](const ::testing::TestParamInfo<std::vector<int>>& info) {
      std::string name = "Ranks";
      for (int b : info.param) name += "_" + std::to_string(b);
      return name;
    });

// Eval mode normalizes with the running statistics and communicates nothing
// (one rank alone runs it here; a collective would wait for the other).
TEST(SyncBatchNormTest, EvalModeUsesRunningStatisticsWithoutCommunicating) {
  torch::set_num_threads(1);
  auto models = ModelsForRanks(2, Model);
  auto plain = Model();
  const torch::Tensor x = torch::randn({2, 3, 6, 6});
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    ObservedBackend observed(backend);
    auto model = models[rank];
    ASSERT_TRUE(ConvertSyncBatchNorm(model.ptr()).ok());
    auto ddp = DistributedDataParallel::Create(model, &observed);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    (*ddp)->forward(x.repeat({2, 1, 1, 1}) * (rank + 1)).sum().backward();
    observed.TakeRecords();
    if (rank == 0) {
      model->eval();
      torch::NoGradGuard no_grad;
      torch::Tensor out = model->forward(x);
      EXPECT_TRUE(observed.TakeRecords().empty());
      // The same as plain BatchNorm in eval mode with those statistics.
      ASSERT_TRUE(LoadStateDict(*plain, GetStateDict(*model)).ok());
      plain->eval();
      EXPECT_TRUE(torch::allclose(out, plain->forward(x), 1e-5, 1e-6));
    }
  });
}

// A Sequential that can sit inside another (LibTorch's AnyModule needs a
// forward that is not a template).
struct BlockImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(x); }
};

TEST(ConvertSyncBatchNormTest, SwapsInPlaceKeepingTensorsOptionsAndMode) {
  namespace nn = torch::nn;
  auto inner = std::make_shared<BlockImpl>(std::initializer_list<nn::NamedAnyModule>{
      {"bn", nn::BatchNorm2d(nn::BatchNormOptions(4).eps(1e-3))}});
  nn::Sequential model({{"conv", nn::Conv2d(nn::Conv2dOptions(3, 4, 1))},
                        {"block", inner},
                        {"bn1d", nn::BatchNorm1d(2)}});
  torch::Tensor weight = inner->ptr(0)->named_parameters()["weight"];
  torch::Tensor running = inner->ptr(0)->named_buffers()["running_mean"];
  inner->ptr(0)->eval();
  // An optimizer made before the conversion still trains the layer.
  torch::optim::SGD sgd(model->parameters(), 0.5);

  absl::StatusOr<std::shared_ptr<torch::nn::Module>> converted =
      ConvertSyncBatchNorm(model.ptr());
  ASSERT_TRUE(converted.ok()) << converted.status();
  EXPECT_EQ(converted->get(), model.ptr().get());
  auto* sync = inner->ptr(0)->as<SyncBatchNormImpl>();
  ASSERT_NE(sync, nullptr);
  EXPECT_NE(model->ptr(2)->as<SyncBatchNormImpl>(), nullptr);
  EXPECT_TRUE(sync->weight.is_same(weight));
  EXPECT_TRUE(sync->running_mean.is_same(running));
  EXPECT_DOUBLE_EQ(sync->options.eps(), 1e-3);
  EXPECT_FALSE(sync->is_training());
  EXPECT_EQ(inner->named_children()["bn"].get(), inner->ptr(0).get());
  // Forward goes through it (the Sequential's module list was updated).
  torch::Tensor out = inner->forward(torch::randn({2, 4, 3, 3}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 4, 3, 3}));

  sync->weight.mutable_grad() = torch::ones_like(sync->weight);
  sgd.step();
  EXPECT_TRUE(torch::allclose(weight, torch::full({4}, 0.5)));

  // A BatchNorm alone becomes a new SyncBatchNorm.
  nn::BatchNorm3d alone(5);
  auto swapped = ConvertSyncBatchNorm(alone.ptr());
  ASSERT_TRUE(swapped.ok());
  EXPECT_NE((*swapped)->as<SyncBatchNormImpl>(), nullptr);
}

// A module whose forward calls a typed BatchNorm field cannot be converted
// from outside in C++: the conversion refuses, naming the layer and the
// fix, and changes nothing; one that calls it by name converts.
struct TypedFieldImpl : torch::nn::Module {
  TypedFieldImpl() : bn(register_module("bn", torch::nn::BatchNorm1d(3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return bn(x); }
  torch::nn::BatchNorm1d bn;
};
TORCH_MODULE(TypedField);

struct ByNameImpl : torch::nn::Module {
  ByNameImpl() { register_module("bn", torch::nn::BatchNorm1d(3)); }
  torch::Tensor forward(const torch::Tensor& x) {
    return ForwardBatchNorm(*this, "bn", x);
  }
};
TORCH_MODULE(ByName);

TEST(ConvertSyncBatchNormTest, RefusesTypedFieldsAndChangesNothing) {
  namespace nn = torch::nn;
  nn::Sequential model({{"first", nn::BatchNorm1d(3)},
                        {"typed", TypedField()},
                        {"named", ByName()}});
  absl::Status status = ConvertSyncBatchNorm(model.ptr()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("'typed.bn'"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("ForwardBatchNorm"));
  EXPECT_EQ(model->ptr(0)->as<SyncBatchNormImpl>(), nullptr);  // untouched
  EXPECT_EQ(FindSyncBatchNorms(*model).size(), 0u);

  nn::Sequential convertible({{"first", nn::BatchNorm1d(3)}, {"named", ByName()}});
  ASSERT_TRUE(ConvertSyncBatchNorm(convertible.ptr()).ok());
  EXPECT_EQ(FindSyncBatchNorms(*convertible).size(), 2u);
  EXPECT_EQ(convertible->forward(torch::randn({4, 3})).sizes(),
            (std::vector<int64_t>{4, 3}));
}

TEST(SyncBatchNormTest, BadInputIsAClearError) {
  SyncBatchNorm bn(4);
  try {
    bn(torch::randn({4}));
    ADD_FAILURE() << "1-D input accepted";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("at least 2D"));
  }
  try {
    bn(torch::randn({2, 5}));
    ADD_FAILURE() << "wrong channel count accepted";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("expected 4 channels"));
  }
}

}  // namespace
}  // namespace gradsync
