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

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, EvenShareTest,
    ::testing::Combine(::testing::Values<int64_t>(1, 2, 6, 8, 13),
                       ::testing::Values(1, 2, 3, 8, 16)));

}  // namespace
}  // namespace gradsync
