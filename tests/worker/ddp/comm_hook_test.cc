// Communication hooks: the future chain, the compression hooks' arithmetic
// and bytes, PowerSGD's approximation, error feedback, start step and
// convergence, and registering hooks on a DDP model. Ranks are threads
// joined by Gloo.
#include "worker/ddp/comm_hook.h"

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "worker/backend/observed_backend.h"
#include "worker/data/datasets.h"
#include "worker/ddp/distributed_data_parallel.h"
#include "worker/ddp/powersgd_hook.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// A bucket over `buffer`, with one gradient view per shape.
GradBucket MakeBucket(torch::Tensor buffer,
                      const std::vector<std::vector<int64_t>>& shapes,
                      int64_t divisor, size_t index = 0, bool is_last = true) {
  GradBucket bucket;
  bucket.index = index;
  bucket.is_last = is_last;
  bucket.buffer = buffer;
  bucket.divisor = divisor;
  int64_t at = 0;
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bucket.gradients.push_back(buffer.narrow(0, at, n).view(shape));
    at += n;
  }
  return bucket;
}

TEST(BucketFutureTest, RunsStagesInOrderAndKeepsTheFirstSequence) {
  std::vector<int> order;
  auto first = std::make_shared<Work>(41);
  auto second = std::make_shared<Work>(42);
  BucketFuture future = BucketFuture::After(first, [&]() -> absl::StatusOr<BucketFuture> {
    order.push_back(1);
    return BucketFuture::After(second, [&]() -> absl::StatusOr<BucketFuture> {
      order.push_back(2);
      return BucketFuture::Value(torch::ones({3}));
    });
  });
  EXPECT_EQ(future.sequence(), 41u);
  EXPECT_TRUE(order.empty());  // nothing runs before Wait
  first->Finish(absl::OkStatus());
  second->Finish(absl::OkStatus());
  absl::StatusOr<torch::Tensor> value = future.Wait(absl::Seconds(10));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_TRUE(torch::equal(*value, torch::ones({3})));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(future.sequence(), 41u);
}

TEST(BucketFutureTest, TheFirstErrorEndsTheChain) {
  bool ran = false;
  BucketFuture future = BucketFuture::After(
      Work::Done(1, absl::UnavailableError("peer left")),
      [&]() -> absl::StatusOr<BucketFuture> {
        ran = true;
        return BucketFuture::Value(torch::ones({1}));
      });
  EXPECT_EQ(future.Wait(absl::Seconds(10)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE(ran);
  EXPECT_EQ(BucketFuture::Error(absl::InternalError("x"))
                .Wait(absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kInternal);
}

TEST(BucketFutureTest, WaitTimesOutOnAStuckCollective) {
  auto stuck = std::make_shared<Work>(7);
  BucketFuture future = BucketFuture::After(
      stuck, []() -> absl::StatusOr<BucketFuture> {
        return BucketFuture::Value(torch::ones({1}));
      });
  EXPECT_EQ(future.Wait(absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  stuck->Finish(absl::OkStatus());
}

class CompressHookTest
    : public ::testing::TestWithParam<std::tuple<int, torch::ScalarType>> {};

// Values that float16 and bfloat16 hold exactly and whose sums stay exact,
// so the result is checked bit for bit: sum over ranks of buffer / W, in
// the compressed type, cast back.
TEST_P(CompressHookTest, DividesThenSumsInTheCompressedTypeAndSendsHalf) {
  const auto [world, dtype] = GetParam();
  std::vector<torch::Tensor> results(world);
  std::vector<std::vector<CollectiveRecord>> records(world);
  RunGlooRanks(world, [&](int rank, Backend* backend) {
    ObservedBackend observed(backend);
    CompressHook hook(dtype);
    torch::Tensor buffer = torch::arange(8, torch::kFloat32) * (rank + 1);
    GradBucket bucket = MakeBucket(buffer, {{8}}, world);
    absl::StatusOr<torch::Tensor> reduced =
        hook.Run(&observed, bucket).Wait(absl::Seconds(30));
    ASSERT_TRUE(reduced.ok()) << reduced.status();
    EXPECT_TRUE(reduced->is_same(buffer));  // decompressed in place
    EXPECT_EQ(bucket.wire_bytes, 8 * 2);
    results[rank] = reduced->clone();
    records[rank] = observed.TakeRecords();
  });
  torch::Tensor expected = torch::zeros({8}, dtype);
  for (int r = 0; r < world; ++r) {
    expected += (torch::arange(8, torch::kFloat32) * (r + 1)).to(dtype) / world;
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(torch::equal(results[r], expected.to(torch::kFloat32)))
        << results[r] << expected;
    ASSERT_EQ(records[r].size(), 1u);
    EXPECT_EQ(records[r][0].dtype, dtype == torch::kHalf ? DataType::kFloat16
                                                         : DataType::kBFloat16);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, CompressHookTest,
    ::testing::Combine(::testing::Values(2, 4),
                       ::testing::Values(torch::kHalf, torch::kBFloat16)));

TEST(AllReduceHookTest, DividesByTheBucketsDivisor) {
  RunGlooRanks(3, [&](int rank, Backend* backend) {
    AllReduceHook hook;
    torch::Tensor buffer = torch::full({4}, 6.0 * (rank + 1));
    // Two ranks' worth of divisor (uneven inputs): the sum over 3 ranks of
    // 6, 12 and 18, divided by 2.
    GradBucket bucket = MakeBucket(buffer, {{4}}, 2);
    absl::StatusOr<torch::Tensor> reduced =
        hook.Run(backend, bucket).Wait(absl::Seconds(30));
    ASSERT_TRUE(reduced.ok()) << reduced.status();
    EXPECT_TRUE(torch::allclose(*reduced, torch::full({4}, 18.0)));
    EXPECT_EQ(bucket.wire_bytes, 16);
  });
}

TEST(PowerSgdHookTest, OptionsAreChecked) {
  PowerSgdOptions options;
  options.start_iter = 1;
  EXPECT_EQ(PowerSgdHook::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.use_error_feedback = false;
  options.warm_start = false;
  EXPECT_TRUE(PowerSgdHook::Create(options).ok());
  options.matrix_approximation_rank = 0;
  EXPECT_EQ(PowerSgdHook::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// No error feedback, no warm start: compression from the first step.
PowerSgdOptions CompressFromTheStart() {
  PowerSgdOptions options;
  options.use_error_feedback = false;
  options.warm_start = false;
  options.start_iter = 0;
  return options;
}

// The same rank-1 64x32 gradient on every rank comes back exactly (one power
// iteration recovers a rank-1 matrix), the bias is averaged uncompressed,
// and the bytes are those of P, Q and the bias.
TEST(PowerSgdHookTest, ReproducesARankOneGradientAndAveragesTheRest) {
  const torch::Tensor u = torch::linspace(-1, 1, 64);
  const torch::Tensor v = torch::linspace(0.5, 2, 32);
  const torch::Tensor matrix = torch::outer(u, v);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    auto hook = PowerSgdHook::Create(CompressFromTheStart());
    ASSERT_TRUE(hook.ok()) << hook.status();
    torch::Tensor buffer = torch::cat(
        {matrix.reshape({-1}), torch::full({32}, rank == 0 ? 1.0 : 3.0)});
    GradBucket bucket = MakeBucket(buffer, {{64, 32}, {32}}, 2);
    absl::StatusOr<torch::Tensor> reduced =
        (*hook)->Run(backend, bucket).Wait(absl::Seconds(30));
    ASSERT_TRUE(reduced.ok()) << reduced.status();
    EXPECT_TRUE(torch::allclose(reduced->narrow(0, 0, 64 * 32).view({64, 32}),
                                matrix, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(reduced->narrow(0, 64 * 32, 32),
                                torch::full({32}, 2.0)));
    EXPECT_EQ(bucket.wire_bytes, (64 + 32 + 32) * 4);
    EXPECT_EQ((*hook)->elements_before(), 64 * 32 + 32);
    EXPECT_EQ((*hook)->elements_after(), 64 + 32 + 32);
  });
}

// A gradient of rank 3 sent as rank 1: without error feedback each step
// sends the same rank-1 approximation, so the mean of what arrives stays
// far from the gradient; with it, what compression dropped is sent in later
// steps, and the mean over steps approaches the gradient.
TEST(PowerSgdHookTest, ErrorFeedbackSendsWhatCompressionDropped) {
  torch::manual_seed(3);
  const torch::Tensor gradient = torch::randn({48, 3}).mm(torch::randn({3, 40}));
  auto mean_error = [&](bool feedback) {
    double error = 0;
    RunGlooRanks(2, [&](int rank, Backend* backend) {
      PowerSgdOptions options;
      options.use_error_feedback = feedback;
      options.start_iter = 2;
      auto hook = PowerSgdHook::Create(options);
      ASSERT_TRUE(hook.ok()) << hook.status();
      torch::Tensor sum = torch::zeros_like(gradient);
      const int steps = 80;
      for (int s = 0; s < steps + 2; ++s) {
        torch::Tensor buffer = gradient.reshape({-1}).clone();
        GradBucket bucket = MakeBucket(buffer, {{48, 40}}, 2);
        absl::StatusOr<torch::Tensor> reduced =
            (*hook)->Run(backend, bucket).Wait(absl::Seconds(30));
        ASSERT_TRUE(reduced.ok()) << reduced.status();
        if (s >= 2) sum += reduced->view({48, 40});  // compressed steps
      }
      if (rank == 0) {
        error = ((sum / steps - gradient).norm() / gradient.norm()).item<double>();
      }
    });
    return error;
  };
  const double with = mean_error(true);
  const double without = mean_error(false);
  EXPECT_LT(with, 0.05);
  EXPECT_GT(without, 0.2);
}

TEST(PowerSgdHookTest, PlainAllReduceUntilTheStartStep) {
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    PowerSgdOptions options;
    options.start_iter = 2;
    auto hook = PowerSgdHook::Create(options);
    ASSERT_TRUE(hook.ok());
    for (int step = 0; step < 3; ++step) {
      torch::Tensor buffer = torch::full({64 * 64}, rank + 1.0);
      GradBucket bucket = MakeBucket(buffer, {{64, 64}}, 2);
      ASSERT_TRUE((*hook)->Run(backend, bucket).Wait(absl::Seconds(30)).ok());
      EXPECT_EQ(bucket.wire_bytes, step < 2 ? 64 * 64 * 4 : (64 + 64) * 4)
          << "step " << step;
    }
    EXPECT_EQ((*hook)->iteration(), 3);
  });
}

// The MLP of the trainer, small.
torch::nn::Sequential Mlp() {
  namespace nn = torch::nn;
  return nn::Sequential({{"flatten", nn::Flatten()},
                         {"fc1", nn::Linear(784, 64)},
                         {"relu1", nn::ReLU()},
                         {"fc2", nn::Linear(64, 64)},
                         {"relu2", nn::ReLU()},
                         {"fc3", nn::Linear(64, 10)}});
}

// Trains the MLP on 2 ranks with `hook` (nullptr: none) and returns the
// mean loss of the last 20 steps and the bytes the buckets sent in the
// last step.
std::pair<double, int64_t> TrainWith(std::function<std::shared_ptr<CommHook>()> hook) {
  const ImageDataset data = MakeSyntheticDataset(4096, 5);
  double loss_tail = 0;
  int64_t bytes = 0;
  auto models = ModelsForRanks(2, [] {
    torch::manual_seed(1);
    return Mlp();
  });
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    auto model = models[rank];
    auto ddp = DistributedDataParallel::Create(model, backend);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    if (hook) {
      ASSERT_TRUE((*ddp)->RegisterCommHook(hook()).ok());
    }
    // At 0.1 PowerSGD's error feedback grew until training turned chaotic:
    // its last loss hung on rounding (0.06 with LibTorch 1.13, 1.66 with
    // 2.6, the same hook output for the first steps); at 0.05 both train
    // the same way (0.27).
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05));
    const int steps = 250, batch = 32;
    double tail = 0;
    for (int s = 0; s < steps; ++s) {
      const int64_t start = ((2 * s + rank) * batch) % (4096 - batch);
      torch::Tensor x = data.images.narrow(0, start, batch);
      torch::Tensor y = data.labels.narrow(0, start, batch);
      sgd.zero_grad();
      torch::Tensor loss =
          torch::nn::functional::cross_entropy((*ddp)->forward(x), y);
      loss.backward();
      sgd.step();
      if (s >= steps - 20) tail += loss.item<double>() / 20;
    }
    if (rank == 0) {
      loss_tail = tail;
      for (const BucketTiming& b : (*ddp)->last_step_timings().bucket_timings) {
        bytes += b.bytes;
      }
    }
  });
  return {loss_tail, bytes};
}

TEST(PowerSgdHookTest, ConvergesOnTheSyntheticTaskAndSendsTheExpectedBytes) {
  torch::set_num_threads(1);
  const auto [plain_loss, plain_bytes] = TrainWith(nullptr);
  const auto [powersgd_loss, powersgd_bytes] = TrainWith([] {
    PowerSgdOptions options;
    options.matrix_approximation_rank = 2;
    options.start_iter = 10;
    return *PowerSgdHook::Create(options);
  });
  // 784x64, 64x64 and 64x10 are compressed at rank 2 (the last one too:
  // (64 + 10) * 2 * 2 < 640); the biases (64, 64, 10) are sent as they are.
  const int64_t all = 784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10;
  const int64_t sent = (784 + 64) * 2 + 64 + (64 + 64) * 2 + 64 + (64 + 10) * 2 + 10;
  EXPECT_EQ(plain_bytes, all * 4);
  EXPECT_EQ(powersgd_bytes, sent * 4);
  std::printf("loss over the last 20 of 250 steps: allreduce %.3f, powersgd "
              "%.3f (initial %.3f); bytes per step %lld vs %lld\n",
              plain_loss, powersgd_loss, std::log(10.0),
              static_cast<long long>(plain_bytes),
              static_cast<long long>(powersgd_bytes));
  const double initial = std::log(10.0);
  EXPECT_LT(plain_loss, 0.25 * initial);
  EXPECT_LT(powersgd_loss, 0.25 * initial);
  EXPECT_LT(powersgd_loss, plain_loss + 0.3);
}

TEST(DdpCommHookTest, RegistrationIsCheckedAndTheHookIsUsed) {
  torch::set_num_threads(1);
  auto models = ModelsForRanks(2, Mlp);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    ObservedBackend observed(backend);
    auto model = models[rank];
    auto ddp = DistributedDataParallel::Create(model, &observed);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    EXPECT_EQ((*ddp)->RegisterCommHook(nullptr).code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(
        (*ddp)->RegisterCommHook(std::make_shared<CompressHook>(torch::kHalf)).ok());
    EXPECT_EQ((*ddp)->reducer().comm_hook_name(), "fp16_compress");
    absl::Status twice =
        (*ddp)->RegisterCommHook(std::make_shared<AllReduceHook>());
    EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
    observed.TakeRecords();
    torch::Tensor x = torch::rand({4, 1, 28, 28});
    (*ddp)->forward(x).sum().backward();
    int half = 0;
    for (const CollectiveRecord& r : observed.TakeRecords()) {
      if (r.op == "allreduce" && r.dtype == DataType::kFloat16) ++half;
    }
    EXPECT_GE(half, 1);
  });
  // After a synchronized step it is too late: every rank must reduce every
  // step the same way.
  models = ModelsForRanks(2, Mlp);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    auto model = models[rank];
    auto ddp = DistributedDataParallel::Create(model, backend);
    ASSERT_TRUE(ddp.ok());
    (*ddp)->forward(torch::rand({2, 1, 28, 28})).sum().backward();
    absl::Status late =
        (*ddp)->RegisterCommHook(std::make_shared<CompressHook>(torch::kHalf));
    EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(late.message()), HasSubstr("before the first"));
  });
}

}  // namespace
}  // namespace gradsync
