// GlobalBatchPlan: every step's micro-batches are shared out whole, once
// each, on every world size; the weights make the update the mean over the
// global batch; positions that no step begins at are refused.
#include "worker/data/global_batch.h"

#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(GlobalBatchPlanTest, RefusesWhatCannotBeDivided) {
  EXPECT_EQ(GlobalBatchPlan::Create(0, 4, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlobalBatchPlan::Create(24, 0, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status uneven = GlobalBatchPlan::Create(24, 5, 100).status();
  EXPECT_EQ(uneven.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(uneven.message().find("multiple of the micro-batch"),
            absl::string_view::npos)
      << uneven;
  EXPECT_EQ(GlobalBatchPlan::Create(24, 4, 23).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlobalBatchPlanTest, AnEpochDropsItsTailShorterThanTheGlobalBatch) {
  absl::StatusOr<GlobalBatchPlan> plan = GlobalBatchPlan::Create(24, 4, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->micro_batches_per_step(), 6);
  EXPECT_EQ(plan->steps_per_epoch(), 4);  // 96 of 100 samples
  EXPECT_FALSE(plan->EndsEpoch(72));
  EXPECT_TRUE(plan->EndsEpoch(96));
  EXPECT_TRUE(plan->CheckStepStart(72).ok());
  for (int64_t bad : {-24, 4, 96, 100}) {
    EXPECT_EQ(plan->CheckStepStart(bad).code(),
              absl::StatusCode::kFailedPrecondition)
        << bad;
  }
  const SampleSpan span = plan->MicroBatchSpan(48, 5);
  EXPECT_EQ(span.begin, 68);
  EXPECT_EQ(span.end, 72);
}

// (micro-batches per step, world size)
class EvenShareTest
    : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(EvenShareTest, EveryMicroBatchRunsOnceInRankOrderWithinOneOfEven) {
  const auto [micro_batches, world] = GetParam();
  absl::StatusOr<GlobalBatchPlan> plan =
      GlobalBatchPlan::Create(micro_batches * 3, 3, micro_batches * 3 * 5);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t next = 0;
  int64_t fewest = micro_batches, most = 0;
  for (int rank = 0; rank < world; ++rank) {
    const MicroBatchShare share = plan->EvenShare(rank, world);
    EXPECT_EQ(share.first, next) << "rank " << rank;
    next += share.count;
    fewest = std::min(fewest, share.count);
    most = std::max(most, share.count);
  }
  EXPECT_EQ(next, micro_batches);
  EXPECT_LE(most - fewest, 1);
  // Divided by B / world and averaged over the world, the B samples count
  // 1 / B each.
  EXPECT_DOUBLE_EQ(plan->LossDivisor(world) * world, plan->global_batch());
}

TEST(GivenSharesTest, RunInRankOrderAndAreChecked) {
  absl::StatusOr<GlobalBatchPlan> plan = GlobalBatchPlan::Create(96, 4, 960);
  ASSERT_TRUE(plan.ok());
  const std::vector<int> shares = {11, 10, 3};
  int64_t next = 0;
  for (int rank = 0; rank < 3; ++rank) {
    absl::StatusOr<MicroBatchShare> share = plan->Share(rank, 3, shares);
    ASSERT_TRUE(share.ok()) << share.status();
    EXPECT_EQ(share->first, next);
    EXPECT_EQ(share->count, shares[rank]);
    next += share->count;
  }
  EXPECT_EQ(next, 24);
  // None: the even share.
  absl::StatusOr<MicroBatchShare> even = plan->Share(1, 3, {});
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(even->first, 8);
  EXPECT_EQ(even->count, 8);
  // Wrong sum, rank count or sign.
  for (const std::vector<int>& bad : std::vector<std::vector<int>>{
           {11, 10, 2}, {12, 12}, {25, 0, -1}}) {
    absl::StatusOr<MicroBatchShare> refused = plan->Share(0, 3, bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, EvenShareTest,
    ::testing::Combine(::testing::Values<int64_t>(1, 2, 6, 8, 13),
                       ::testing::Values(1, 2, 3, 8, 16)));

}  // namespace
}  // namespace gradsync
