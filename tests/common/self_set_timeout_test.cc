// SelfSetTimeout: the percentile, the bounds, the fallback before enough
// steps, and a fixed timeout.
#include "common/self_set_timeout.h"

#include <optional>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(SelfSetTimeoutTest, FollowsTheStepTimesWithinItsBounds) {
  const SelfSetTimeout::Bounds bounds;  // 1 s to 10 min, 30 s before, x10
  SelfSetTimeout fast(std::nullopt, bounds), slow(std::nullopt, bounds);
  for (int i = 0; i < SelfSetTimeout::kMinSamples - 1; ++i) {
    fast.AddStep(absl::Milliseconds(50));
    slow.AddStep(absl::Seconds(10));
  }
  EXPECT_FALSE(fast.self_set());
  EXPECT_EQ(fast.value(), absl::Seconds(30)) << "too few steps: the fallback";
  fast.AddStep(absl::Milliseconds(50));
  slow.AddStep(absl::Seconds(10));
  EXPECT_TRUE(fast.self_set());
  EXPECT_EQ(fast.value(), absl::Seconds(1)) << "10 x 50 ms, raised to the minimum";
  EXPECT_EQ(slow.value(), absl::Seconds(100));
  for (int i = 0; i < SelfSetTimeout::kSamples; ++i) slow.AddStep(absl::Hours(1));
  EXPECT_EQ(slow.value(), absl::Minutes(10)) << "the maximum";
}

TEST(SelfSetTimeoutTest, TheNinetyNinthPercentileIgnoresAFewOutliers) {
  SelfSetTimeout timeout(std::nullopt, SelfSetTimeout::Bounds());
  for (int i = 0; i < SelfSetTimeout::kSamples; ++i) {
    timeout.AddStep(i < 2 ? absl::Seconds(60) : absl::Milliseconds(200));
  }
  EXPECT_EQ(timeout.value(), absl::Seconds(2));
}

TEST(SelfSetTimeoutTest, AJobsOwnTimeoutIsFixed) {
  SelfSetTimeout timeout(absl::Seconds(45), SelfSetTimeout::Bounds());
  for (int i = 0; i < 50; ++i) timeout.AddStep(absl::Milliseconds(10));
  EXPECT_FALSE(timeout.self_set());
  EXPECT_EQ(timeout.value(), absl::Seconds(45));
}

TEST(SelfSetTimeoutTest, AFactorOfZeroKeepsTheFallback) {
  SelfSetTimeout::Bounds bounds;
  bounds.factor = 0;
  SelfSetTimeout timeout(std::nullopt, bounds);
  for (int i = 0; i < 50; ++i) timeout.AddStep(absl::Milliseconds(10));
  EXPECT_FALSE(timeout.self_set());
  EXPECT_EQ(timeout.value(), absl::Seconds(30));
}

}  // namespace
}  // namespace gradsync
