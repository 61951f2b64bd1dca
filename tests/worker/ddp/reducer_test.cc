// The reducer's bucket layout and its rebuild, through its public API:
// buckets take parameters in reverse registration order, one dtype per
// bucket, the first closing at first_bucket_bytes and later ones at
// bucket_cap_bytes; after the first synchronized step they are rebuilt in the
// order gradients became ready on rank 0, on every rank. Ranks are threads
// joined by the Gloo backend over an in-memory store.
#include "worker/ddp/reducer.h"

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "worker/ddp/distributed_data_parallel.h"

namespace gradsync {
namespace {

using Assignment = std::vector<std::vector<size_t>>;

constexpr int64_t kHuge = int64_t{1} << 40;

// The buckets a Reducer forms over float32 parameters of `numels` elements
// (4 bytes each), registered in that order, on a world of one.
Assignment LayoutOf(const std::vector<int64_t>& numels,
                    int64_t first_bucket_bytes, int64_t bucket_cap_bytes) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < numels.size(); ++i) {
    names.push_back(absl::StrCat("p", i));
    params.push_back(torch::zeros({numels[i]}, torch::requires_grad()));
  }
  ReducerOptions options;
  options.first_bucket_bytes = first_bucket_bytes;
  options.bucket_cap_bytes = bucket_cap_bytes;
  Assignment assignment;
  RunGlooRanks(1, [&](int, Backend* backend) {
    Reducer reducer(names, params, backend, options);
    assignment = reducer.bucket_assignment();
  });
  return assignment;
}

struct LayoutCase {
  std::string name;
  std::vector<int64_t> numels;
  int64_t first_bucket_bytes = 0;
  int64_t bucket_cap_bytes = 0;
  Assignment expected;
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

class BucketLayoutTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(BucketLayoutTest, MatchesTheExpectedAssignment) {
  const LayoutCase& c = GetParam();
  EXPECT_EQ(LayoutOf(c.numels, c.first_bucket_bytes, c.bucket_cap_bytes),
            c.expected);
}

// Parameters of 100..500 float32 elements: 400, 800, 1200, 1600, 2000
// bytes for p0..p4, taken as p4, p3, p2, p1, p0.
const std::vector<int64_t> kFive = {100, 200, 300, 400, 500};

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Layouts, BucketLayoutTest,
    ::testing::Values(
        // p4+p3 = 3600 >= 3000 closes the first; p2+p1 = 2000 >= 2000 (the
        // cap, reached exactly) closes the second; p0 is left open. Were the
        // limits swapped or shared, the split would differ.
        LayoutCase{"FirstBucketClosesAtFirstBucketBytesLaterOnesAtTheCap",
                   kFive, 3000, 2000, {{4, 3}, {2, 1}, {0}}},
        // p4 = 2000 reaches the first limit alone; p3+p2 = 2800 < 3000, so
        // p1 joins (3600) before the second closes.
        LayoutCase{"ASmallFirstBucketHoldsOnlyTheLastParameters",
                   kFive, 2000, 3000, {{4}, {3, 2, 1}, {0}}},
        // p4 = 1000 bytes closes the first; p3 (20000 bytes, 20x the cap)
        // opens and closes the second alone; p2, p1, p0 (400 each) share the
        // third.
        LayoutCase{"AParameterLargerThanTheCapGetsItsOwnBucket",
                   {100, 100, 100, 5000, 250}, 1000, 1000,
                   {{4}, {3}, {2, 1, 0}}},
        LayoutCase{"ACapOfOneByteGivesEveryParameterItsOwnBucket",
                   kFive, 1, 1, {{4}, {3}, {2}, {1}, {0}}},
        LayoutCase{"AHugeCapGivesOneBucket",
                   kFive, kHuge, kHuge, {{4, 3, 2, 1, 0}}}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) {
      return info.param.name;
    });
// clang-format on

// Three float32 layers with a float64 one in the middle.
struct MixedImpl : torch::nn::Module {
  MixedImpl()
      : a(register_module("a", torch::nn::Linear(4, 4))),
        b(register_module("b", torch::nn::Linear(4, 4))),
        c(register_module("c", torch::nn::Linear(4, 4))) {
    b->to(torch::kFloat64);
  }
  torch::nn::Linear a, b, c;
};
TORCH_MODULE(Mixed);

// Parameters a.weight, a.bias, b.weight, b.bias, c.weight, c.bias are 0..5;
// b's (2, 3) are float64. Even with room for all, the float64 ones get their
// own bucket. The key is (dtype, device): parameters on different devices
// are kept apart the same way, which needs a GPU to test; these are on CPU.
TEST(BucketDtypeTest, ParametersOfDifferentDtypesNeverShareABucket) {
  auto models = ModelsForRanks(1, [] { return Mixed(); });
  DdpOptions options;
  options.reducer.first_bucket_bytes = kHuge;
  options.reducer.bucket_cap_bytes = kHuge;
  Assignment assignment;
  RunGlooRanks(1, [&](int rank, Backend* backend) {
    auto ddp = DistributedDataParallel::Create(models[rank], backend, options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    assignment = (*ddp)->reducer().bucket_assignment();
  });
  EXPECT_EQ(assignment, (Assignment{{5, 4, 1, 0}, {3, 2}}));
}

constexpr int kWidth = 4;

// Bias-free kWidth x kWidth linear layers named by the letters of `names`,
// registered in that order, so parameter i is the weight of layer names[i].
// forward applies the layers named in `order`, first to last, and leaves the
// others unused; their gradients become ready in the reverse of `order`.
struct ChainImpl : torch::nn::Module {
  explicit ChainImpl(const std::string& names) {
    for (char name : names) {
      layers.emplace(
          name, register_module(
                    std::string(1, name),
                    torch::nn::Linear(
                        torch::nn::LinearOptions(kWidth, kWidth).bias(false))));
    }
  }
  torch::Tensor forward(torch::Tensor x, const std::string& order) {
    for (char name : order) x = layers.at(name)(x);
    return x;
  }
  std::map<char, torch::nn::Linear> layers;
};
TORCH_MODULE(Chain);

// One bucket per parameter: the assignment shows the order alone.
DdpOptions OneBucketPerParameter() {
  DdpOptions options;
  options.reducer.first_bucket_bytes = 1;
  options.reducer.bucket_cap_bytes = 1;
  return options;
}

// One forward applying `order` and the backward of its sum, through `ddp`.
void Step(DistributedDataParallel& ddp, Chain& model,
          const std::string& order) {
  torch::Tensor x = torch::ones({2, kWidth});
  ddp.Forward([&] { return model->forward(x, order).sum(); }).backward();
}

// What each rank's reducer reports.
struct Buckets {
  Assignment before;  // after Create
  Assignment after;   // after the steps
  bool rebuilt = false;
};

// Wraps a Chain over `names` on each of `world` ranks and runs one
// synchronized step per entry of `orders_by_rank[rank]` (the forward order
// of each step on that rank).
std::vector<Buckets> RunSteps(
    int world, const std::string& names, DdpOptions options,
    const std::vector<std::vector<std::string>>& orders_by_rank) {
  auto models = ModelsForRanks(world, [&] { return Chain(names); });
  std::vector<Buckets> buckets(world);
  RunGlooRanks(world, [&](int rank, Backend* backend) {
    auto ddp = DistributedDataParallel::Create(models[rank], backend, options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    buckets[rank].before = (*ddp)->reducer().bucket_assignment();
    for (const std::string& order : orders_by_rank[rank]) {
      Step(**ddp, models[rank], order);
    }
    buckets[rank].after = (*ddp)->reducer().bucket_assignment();
    buckets[rank].rebuilt = (*ddp)->reducer().buckets_rebuilt();
  });
  return buckets;
}

// Layers a, b, c (parameters 0, 1, 2) applied as b, c, a: gradients become
// ready for a, c, b = 0, 2, 1, not in reverse registration order (2, 1, 0).
TEST(BucketRebuildTest, FollowsTheOrderGradientsBecameReadyInTheFirstStep) {
  std::vector<Buckets> buckets =
      RunSteps(2, "abc", OneBucketPerParameter(), {{"bca"}, {"bca"}});
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_EQ(buckets[rank].before, (Assignment{{2}, {1}, {0}}));
    EXPECT_TRUE(buckets[rank].rebuilt);
    EXPECT_EQ(buckets[rank].after, (Assignment{{0}, {2}, {1}}));
  }
}

// The same ready order 0, 2, 1 (64 bytes each): the first rebuilt bucket
// closes at first_bucket_bytes = 64, the rest share the huge cap (as before
// the rebuild, in reverse registration order).
TEST(BucketRebuildTest, RebuiltBucketsKeepTheFirstBucketLimitAndTheCap) {
  DdpOptions options;
  options.reducer.first_bucket_bytes = kWidth * kWidth * 4;
  options.reducer.bucket_cap_bytes = kHuge;
  std::vector<Buckets> buckets =
      RunSteps(2, "abc", options, {{"bca"}, {"bca"}});
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_EQ(buckets[rank].before, (Assignment{{2}, {1, 0}}));
    EXPECT_EQ(buckets[rank].after, (Assignment{{0}, {2, 1}}));
  }
}

// Rank 1 applies c, a, b (ready: b, a, c = 1, 0, 2), rank 0 b, c, a (ready
// 0, 2, 1): both adopt rank 0's order.
TEST(BucketRebuildTest, EveryRankAdoptsRankZerosOrder) {
  std::vector<Buckets> buckets =
      RunSteps(2, "abc", OneBucketPerParameter(), {{"bca"}, {"cab"}});
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_TRUE(buckets[rank].rebuilt);
    EXPECT_EQ(buckets[rank].after, (Assignment{{0}, {2}, {1}}));
  }
}

// A second step in another order (ready 1, 0, 2) leaves the first step's
// buckets in place.
TEST(BucketRebuildTest, HappensOnlyAfterTheFirstStep) {
  std::vector<Buckets> buckets = RunSteps(2, "abc", OneBucketPerParameter(),
                                          {{"bca", "cab"}, {"bca", "cab"}});
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_EQ(buckets[rank].after, (Assignment{{0}, {2}, {1}}));
  }
}

// A step under no_sync reduces nothing, so neither its order (ready 1, 0, 2)
// nor its end rebuilds: the first synchronized step's order (0, 2, 1) does.
TEST(BucketRebuildTest, StepsUnderNoSyncNeitherRebuildNorCount) {
  auto models = ModelsForRanks(2, [] { return Chain("abc"); });
  std::vector<Buckets> buckets(2);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    auto ddp = DistributedDataParallel::Create(models[rank], backend,
                                               OneBucketPerParameter());
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    {
      auto no_sync = (*ddp)->NoSync();
      Step(**ddp, models[rank], "cab");
    }
    buckets[rank].rebuilt = (*ddp)->reducer().buckets_rebuilt();
    buckets[rank].before = (*ddp)->reducer().bucket_assignment();
    Step(**ddp, models[rank], "bca");
    buckets[rank].after = (*ddp)->reducer().bucket_assignment();
  });
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_FALSE(buckets[rank].rebuilt);
    EXPECT_EQ(buckets[rank].before, (Assignment{{2}, {1}, {0}}));
    EXPECT_EQ(buckets[rank].after, (Assignment{{0}, {2}, {1}}));
  }
}

DdpOptions OneBucketPerParameterFindingUnused() {
  DdpOptions options = OneBucketPerParameter();
  options.reducer.find_unused_parameters = true;
  return options;
}

// Layers a, u, b, c (0..3) applied as b, c, a; u gets no gradient: ready
// 0, 3, 2, then u (1) last.
TEST(BucketRebuildTest, AnUnusedParameterGoesLast) {
  std::vector<Buckets> buckets = RunSteps(
      2, "aubc", OneBucketPerParameterFindingUnused(), {{"bca"}, {"bca"}});
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_TRUE(buckets[rank].rebuilt);
    EXPECT_EQ(buckets[rank].after, (Assignment{{0}, {3}, {2}, {1}}));
  }
}

// Layers a, u, b, c, v (0..4) applied as b, c, a; u and v get no gradient:
// ready 0, 3, 2, then the unused ones in reverse registration order, v (4)
// before u (1).
TEST(BucketRebuildTest, UnusedParametersGoLastInReverseRegistrationOrder) {
  std::vector<Buckets> buckets = RunSteps(
      2, "aubcv", OneBucketPerParameterFindingUnused(), {{"bca"}, {"bca"}});
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_EQ(buckets[rank].after, (Assignment{{0}, {3}, {2}, {4}, {1}}));
  }
}

// A first synchronized step whose backward fails (u gets no gradient without
// find_unused_parameters) reduces nothing; the next one, which uses u first
// (ready: a, c, b, u = 0, 2, 1, 3), succeeds and decides the order.
TEST(BucketRebuildTest, AFailedStepDoesNotCountTowardsTheOrder) {
  auto models = ModelsForRanks(2, [] { return Chain("abcu"); });
  std::vector<Buckets> buckets(2);
  std::vector<std::string> first_errors(2), second_errors(2);
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    auto ddp = DistributedDataParallel::Create(models[rank], backend,
                                               OneBucketPerParameter());
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    try {
      Step(**ddp, models[rank], "bca");
    } catch (const c10::Error& e) {
      first_errors[rank] = e.what_without_backtrace();
    }
    try {
      Step(**ddp, models[rank], "ubca");
    } catch (const c10::Error& e) {
      second_errors[rank] = e.what_without_backtrace();
    }
    buckets[rank].after = (*ddp)->reducer().bucket_assignment();
  });
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_NE(first_errors[rank], "") << "the first step must fail";
    ASSERT_EQ(second_errors[rank], "");
    EXPECT_EQ(buckets[rank].after, (Assignment{{0}, {2}, {1}, {3}}));
  }
}

}  // namespace
}  // namespace gradsync
