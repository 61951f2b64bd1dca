// DistributedSampler against PyTorch's torch.utils.data.DistributedSampler.
// The expected lists were printed by PyTorch 1.13 (Debian's python3-torch):
//   s = DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=shuffle,
//                          seed=seed, drop_last=drop_last)
//   s.set_epoch(e); list(s)
#include "worker/data/distributed_sampler.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

struct Case {
  int64_t n;
  int world_size;
  int rank;
  bool shuffle;
  uint64_t seed;
  bool drop_last;
  std::vector<int64_t> first_epoch;  // epoch 0
  std::vector<int64_t> later_epoch;  // epoch `later`
  int64_t later = 1;
};

class MatchesPyTorch : public ::testing::TestWithParam<Case> {};

TEST_P(MatchesPyTorch, SameIndicesAsPyTorch) {
  const Case& c = GetParam();
  SamplerOptions options;
  options.dataset_size = c.n;
  options.world_size = c.world_size;
  options.rank = c.rank;
  options.shuffle = c.shuffle;
  options.seed = c.seed;
  options.drop_last = c.drop_last;
  auto sampler = DistributedSampler::Create(options);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  sampler->SetEpoch(0);
  EXPECT_THAT(sampler->Indices(), ElementsAreArray(c.first_epoch));
  EXPECT_EQ(sampler->num_samples(),
            static_cast<int64_t>(c.first_epoch.size()));
  sampler->SetEpoch(c.later);
  EXPECT_THAT(sampler->Indices(), ElementsAreArray(c.later_epoch));
}

INSTANTIATE_TEST_SUITE_P(
    DistributedSampler, MatchesPyTorch,
    ::testing::Values(
        // In order: rank r takes r, r+W, ...; padded from the start.
        Case{10, 3, 0, false, 0, false, {0, 3, 6, 9}, {0, 3, 6, 9}},
        Case{10, 3, 2, false, 0, false, {2, 5, 8, 1}, {2, 5, 8, 1}},
        // Shuffled: randperm seeded by seed + epoch.
        Case{10, 3, 1, true, 7, false, {0, 1, 6, 5}, {5, 2, 7, 3}},
        Case{10, 3, 1, true, 7, true, {0, 1, 6}, {5, 2, 7}},
        Case{10, 4, 3, true, 0, true, {5, 8}, {2, 3}},
        // Fewer samples than ranks: padding repeats the list.
        Case{2, 5, 4, false, 0, false, {0}, {0}},
        Case{2, 5, 4, true, 3, false, {0}, {0}},
        Case{11, 2, 0, true, 5, false, {9, 0, 10, 3, 7, 4},
             {2, 8, 1, 5, 3, 10}},
        Case{20, 3, 1, true, 42, false, {14, 1, 4, 8, 17, 19, 9},
             {16, 12, 14, 9, 3, 7, 10}, 5},
        Case{20, 3, 2, true, 42, true, {18, 10, 6, 3, 13, 5},
             {5, 6, 0, 4, 2, 1}, 5}));

// Every sample is seen exactly once per epoch across ranks when the size
// divides evenly, for several world sizes, with and without shuffle.
TEST(DistributedSamplerTest, RanksPartitionTheDataset) {
  for (int world_size : {1, 2, 3, 4, 8}) {
    for (bool shuffle : {false, true}) {
      const int64_t n = 24 * 35;
      std::vector<int64_t> seen;
      for (int rank = 0; rank < world_size; ++rank) {
        auto sampler = DistributedSampler::Create(
            {n, rank, world_size, shuffle, /*seed=*/11, /*drop_last=*/false});
        ASSERT_TRUE(sampler.ok());
        sampler->SetEpoch(3);
        std::vector<int64_t> mine = sampler->Indices();
        EXPECT_EQ(static_cast<int64_t>(mine.size()), n / world_size);
        seen.insert(seen.end(), mine.begin(), mine.end());
      }
      std::sort(seen.begin(), seen.end());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], i);
    }
  }
}

TEST(DistributedSamplerTest, EpochsShuffleDifferently) {
  auto sampler = DistributedSampler::Create({100, 0, 1, true, 0, false});
  ASSERT_TRUE(sampler.ok());
  std::vector<int64_t> first = sampler->Indices();
  sampler->SetEpoch(1);
  EXPECT_NE(first, sampler->Indices());
  sampler->SetEpoch(0);
  EXPECT_EQ(first, sampler->Indices());
}

TEST(DistributedSamplerTest, EmptyDataset) {
  auto sampler = DistributedSampler::Create({0, 1, 2, true, 0, false});
  ASSERT_TRUE(sampler.ok());
  EXPECT_TRUE(sampler->Indices().empty());
  EXPECT_EQ(sampler->total_size(), 0);
}

TEST(DistributedSamplerTest, BadArguments) {
  auto negative = DistributedSampler::Create({-1, 0, 1, false, 0, false});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  auto no_ranks = DistributedSampler::Create({10, 0, 0, false, 0, false});
  EXPECT_EQ(no_ranks.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_rank = DistributedSampler::Create({10, 3, 3, false, 0, false});
  EXPECT_EQ(bad_rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_rank.status().message()),
              HasSubstr("rank 3 is outside [0, 3)"));
}

// A division from `start` (after the world size changed mid-epoch) hands
// out the rest of the epoch's order: with the earlier division's consumed
// prefix, every sample is used exactly once.
TEST(DistributedSamplerStartTest, DividesTheRestOfTheEpochAmongTheNewRanks) {
  for (bool shuffle : {false, true}) {
    // 3 ranks consumed 2 batches of 2 (12 samples) of an epoch of 24.
    std::multiset<int64_t> used;
    for (int rank = 0; rank < 3; ++rank) {
      auto before = DistributedSampler::Create({24, rank, 3, shuffle, 5});
      ASSERT_TRUE(before.ok());
      before->SetEpoch(4);
      std::vector<int64_t> mine = before->Indices();
      used.insert(mine.begin(), mine.begin() + 4);
    }
    for (int rank = 0; rank < 2; ++rank) {
      SamplerOptions options{24, rank, 2, shuffle, 5};
      options.start = 12;
      auto after = DistributedSampler::Create(options);
      ASSERT_TRUE(after.ok());
      after->SetEpoch(4);
      EXPECT_EQ(after->num_samples(), 6);
      std::vector<int64_t> mine = after->Indices();
      used.insert(mine.begin(), mine.end());
    }
    ASSERT_EQ(used.size(), 24u);
    for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(used.count(i), 1u) << i;
  }
}

TEST(DistributedSamplerStartTest, StartZeroIsTheWholeEpochAndStartIsChecked) {
  SamplerOptions options{10, 1, 3, true, 9};
  auto whole = DistributedSampler::Create(options);
  options.start = 0;
  auto zero = DistributedSampler::Create(options);
  ASSERT_TRUE(whole.ok() && zero.ok());
  EXPECT_EQ(whole->Indices(), zero->Indices());
  // An uneven rest is padded from its own start, as PyTorch pads an epoch.
  options = SamplerOptions{10, 0, 3};
  options.start = 6;  // 4 left for 3 ranks: 2 each, one padded
  auto rest = DistributedSampler::Create(options);
  ASSERT_TRUE(rest.ok());
  EXPECT_THAT(rest->Indices(), ElementsAreArray({6, 9}));
  options.start = 11;
  auto bad = DistributedSampler::Create(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("start 11 is outside [0, 10]"));
}

}  // namespace
}  // namespace gradsync
