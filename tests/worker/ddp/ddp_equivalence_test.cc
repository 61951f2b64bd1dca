// DistributedDataParallel against the arithmetic it promises: W ranks
// training on shards of each global batch end with the same parameters as one
// process training on the whole batch. Ranks are threads joined by the Gloo
// backend over an in-memory store.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "worker/ddp/distributed_data_parallel.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

constexpr int kIn = 8;
constexpr int kHidden = 16;
constexpr int kClasses = 4;
constexpr int kPerRankBatch = 4;
constexpr double kLearningRate = 0.1;

// fc1 -> relu -> fc2 -> relu -> fc3; `unused` is registered but, unless
// `use_extra` is set, takes no part in forward.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int hidden = kHidden)
      : fc1(register_module("fc1", torch::nn::Linear(kIn, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, kHidden))),
        fc3(register_module("fc3", torch::nn::Linear(kHidden, kClasses))),
        unused(register_module("unused", torch::nn::Linear(kHidden, kHidden))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_extra) {
    torch::Tensor h = torch::relu(fc2(torch::relu(fc1(x))));
    if (use_extra) h = h + unused(h);
    return fc3(h);
  }
  torch::nn::Linear fc1, fc2, fc3, unused;
};
TORCH_MODULE(Net);

// The data of every step: inputs [global batch, kIn] and labels.
struct Step {
  torch::Tensor x, y;
};

std::vector<Step> MakeData(int steps, int world_size) {
  torch::manual_seed(1234);
  std::vector<Step> data;
  for (int s = 0; s < steps; ++s) {
    data.push_back({torch::randn({world_size * kPerRankBatch, kIn}),
                    torch::randint(0, kClasses, {world_size * kPerRankBatch},
                                   torch::kInt64)});
  }
  return data;
}

// Copies `from`'s parameters into `to`.
void CopyParams(Net& from, Net& to) {
  torch::NoGradGuard no_grad;
  auto src = from->parameters();
  auto dst = to->parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
}

struct Scenario {
  std::string name;
  int world_size = 2;
  DdpOptions options;
  // Micro-steps accumulated with no_sync before each synchronized one.
  int accumulate = 0;
  // Whether the `unused` layer takes part in forward on even steps only
  // (unused on odd steps: needs find_unused_parameters).
  bool sometimes_unused = false;
};

void PrintTo(const Scenario& scenario, std::ostream* os) { *os << scenario.name; }

// The reference: one process, whole global batches, same SGD.
std::vector<torch::Tensor> TrainReference(Net init,
                                          const std::vector<Step>& data,
                                          const Scenario& scenario) {
  Net model;
  CopyParams(init, model);
  torch::optim::SGD sgd(model->parameters(), kLearningRate);
  const int group = scenario.accumulate + 1;
  for (size_t s = 0; s < data.size(); s += group) {
    sgd.zero_grad();
    for (int k = 0; k < group; ++k) {
      const Step& step = data[s + k];
      bool use_extra = !scenario.sometimes_unused || ((s + k) % 2 == 0);
      torch::Tensor out = model->forward(step.x, use_extra);
      // Mean over the global batch == mean over ranks of each rank's mean.
      torch::nn::functional::cross_entropy(out, step.y).backward();
    }
    sgd.step();
  }
  std::vector<torch::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

std::vector<torch::Tensor> TrainDistributed(Net init,
                                            const std::vector<Step>& data,
                                            const Scenario& scenario,
                                            int* rebuilt_ranks) {
  std::vector<std::vector<torch::Tensor>> results(scenario.world_size);
  std::atomic<int> rebuilt{0};
  RunGlooRanks(scenario.world_size, [&](int rank, Backend* backend) {
    Net model;  // rank 0's copy of `init` reaches every rank by broadcast
    if (rank == 0) CopyParams(init, model);
    auto ddp = DistributedDataParallel::Create(model.ptr(), backend,
                                               scenario.options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    torch::optim::SGD sgd(model->parameters(), kLearningRate);
    const int group = scenario.accumulate + 1;
    for (size_t s = 0; s < data.size(); s += group) {
      sgd.zero_grad();
      for (int k = 0; k < group; ++k) {
        const Step& step = data[s + k];
        torch::Tensor x = step.x.narrow(0, rank * kPerRankBatch, kPerRankBatch);
        torch::Tensor y = step.y.narrow(0, rank * kPerRankBatch, kPerRankBatch);
        bool use_extra = !scenario.sometimes_unused || ((s + k) % 2 == 0);
        auto run = [&] {
          torch::Tensor loss = (*ddp)->Forward([&] {
            return torch::nn::functional::cross_entropy(
                model->forward(x, use_extra), y);
          });
          loss.backward();
        };
        if (k + 1 < group) {
          auto no_sync = (*ddp)->NoSync();
          run();
        } else {
          run();
        }
      }
      sgd.step();
    }
    if ((*ddp)->reducer().buckets_rebuilt()) ++rebuilt;
    for (const auto& p : model->parameters()) {
      results[rank].push_back(p.detach().clone());
    }
  });
  // Every rank must hold the same parameters.
  for (int r = 1; r < scenario.world_size; ++r) {
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(results[0][i], results[r][i]))
          << "rank " << r << " parameter " << i << " differs from rank 0";
    }
  }
  *rebuilt_ranks = rebuilt;
  return results[0];
}

double MaxRelativeError(const std::vector<torch::Tensor>& a,
                        const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double diff = (a[i] - b[i]).abs().max().item<double>();
    double scale = std::max(b[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

class DdpEquivalenceTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(DdpEquivalenceTest, MatchesOneProcessOnTheGlobalBatch) {
  torch::set_num_threads(1);
  const Scenario& scenario = GetParam();
  const int steps = 6 * (scenario.accumulate + 1);
  std::vector<Step> data = MakeData(steps, scenario.world_size);
  torch::manual_seed(7);
  Net init;
  std::vector<torch::Tensor> expected = TrainReference(init, data, scenario);
  int rebuilt_ranks = 0;
  std::vector<torch::Tensor> got =
      TrainDistributed(init, data, scenario, &rebuilt_ranks);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_LE(MaxRelativeError(got, expected), 1e-5);
  EXPECT_EQ(rebuilt_ranks, scenario.world_size)
      << "buckets rebuild after the first step on every rank";
}

Scenario Make(std::string name, int world_size,
              std::function<void(Scenario*)> tweak = nullptr) {
  Scenario s;
  s.name = std::move(name);
  s.world_size = world_size;
  if (tweak) tweak(&s);
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, DdpEquivalenceTest,
    ::testing::Values(
        Make("Default2", 2), Make("Default3", 3),
        Make("EveryParameterItsOwnBucket3", 3,
             [](Scenario* s) {
               s->options.reducer.first_bucket_bytes = 1;
               s->options.reducer.bucket_cap_bytes = 1;
             }),
        Make("OneBucket2", 2,
             [](Scenario* s) {
               s->options.reducer.first_bucket_bytes = int64_t{1} << 40;
               s->options.reducer.bucket_cap_bytes = int64_t{1} << 40;
             }),
        Make("GradientAsBucketView3", 3,
             [](Scenario* s) {
               s->options.reducer.gradient_as_bucket_view = true;
             }),
        Make("FindUnusedParameters2", 2,
             [](Scenario* s) {
               s->options.reducer.find_unused_parameters = true;
               s->sometimes_unused = true;
             }),
        Make("NoSyncAccumulation3", 3, [](Scenario* s) { s->accumulate = 2; }),
        Make("NoSyncWithBucketView2", 2,
             [](Scenario* s) {
               s->accumulate = 1;
               s->options.reducer.gradient_as_bucket_view = true;
             })),
    [](const ::testing::TestParamInfo<Scenario>& info) {
      return info.param.name;
    });

TEST(DdpTest, MismatchedModelsNameTheFirstDifferentParameter) {
  torch::set_num_threads(1);
  std::vector<absl::Status> statuses(2);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    Net model(rank == 0 ? kHidden : kHidden + 1);  // fc1 differs on rank 1
    statuses[rank] =
        DistributedDataParallel::Create(model.ptr(), backend).status();
  });
  for (const absl::Status& status : statuses) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(), HasSubstr("fc1.weight"));
    EXPECT_THAT(status.message(), HasSubstr("rank 1"));
  }
}

TEST(DdpTest, UnusedParametersWithoutTheOptionFailBackwardNamingThem) {
  torch::set_num_threads(1);
  std::vector<std::string> errors(2);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    Net model;
    auto ddp = DistributedDataParallel::Create(model.ptr(), backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    torch::Tensor x = torch::ones({2, kIn});
    torch::Tensor loss =
        (*ddp)->Forward([&] { return model->forward(x, false).sum(); });
    try {
      loss.backward();
    } catch (const c10::Error& e) {
      errors[rank] = e.what();
    }
  });
  for (const std::string& error : errors) {
    EXPECT_THAT(error, HasSubstr("unused.weight"));
    EXPECT_THAT(error, HasSubstr("find_unused_parameters"));
  }
}

TEST(DdpTest, StepTimingsAreConsistent) {
  torch::set_num_threads(1);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    Net model;
    auto ddp = DistributedDataParallel::Create(model.ptr(), backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    torch::Tensor x = torch::ones({2, kIn});
    for (int i = 0; i < 2; ++i) {
      (*ddp)->Forward([&] { return model->forward(x, true).sum(); }).backward();
    }
    StepTimings t = (*ddp)->last_step_timings();
    EXPECT_GE(t.forward, absl::ZeroDuration());
    EXPECT_GE(t.communication, absl::ZeroDuration());
    EXPECT_GE(t.hidden_communication, absl::ZeroDuration());
    EXPECT_LE(t.hidden_communication, t.communication);
    EXPECT_GE(t.exposed_communication, absl::ZeroDuration());
    // The collectives' own run times, bucket by bucket, add up to the
    // step's communication.
    EXPECT_GT(t.communication, absl::ZeroDuration());
    absl::Duration buckets;
    for (const BucketTiming& b : t.bucket_timings) buckets += b.allreduce;
    EXPECT_EQ(buckets, t.communication);
    EXPECT_GE(t.buckets, 1);
  });
}

}  // namespace
}  // namespace gradsync
