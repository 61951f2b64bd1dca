#include "server/share_balancer.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

double Slowest(const std::vector<int>& shares, const std::vector<double>& t) {
  double most = 0;
  for (size_t r = 0; r < t.size(); ++r) most = std::max(most, shares[r] * t[r]);
  return most;
}

TEST(BalancedSharesTest, EqualSpeedsShareEvenly) {
  EXPECT_THAT(BalancedShares(24, {1, 1, 1}), ElementsAre(8, 8, 8));
  EXPECT_THAT(BalancedShares(25, {1, 1, 1}), ElementsAre(9, 8, 8));
}

TEST(BalancedSharesTest, AreProportionalToSpeedAndOptimal) {
  // max(a, b, 2c) with a + b + c = 24 is least at 10.
  const std::vector<int> shares = BalancedShares(24, {1, 1, 2});
  EXPECT_EQ(std::accumulate(shares.begin(), shares.end(), 0), 24);
  EXPECT_EQ(Slowest(shares, {1, 1, 2}), 10);
  // Brute force over every division of 12 among 3 ranks (at least 2 each).
  const std::vector<double> t = {1.0, 2.5, 0.7};
  double best = 1e9;
  for (int a = kMinShare; a <= 12 - 2 * kMinShare; ++a) {
    for (int b = kMinShare; a + b <= 12 - kMinShare; ++b) {
      best = std::min(best, Slowest({a, b, 12 - a - b}, t));
    }
  }
  EXPECT_DOUBLE_EQ(Slowest(BalancedShares(12, t), t), best);
}

TEST(BalancedSharesTest, EveryRankKeepsTwo) {
  EXPECT_THAT(BalancedShares(8, {1, 100, 1}), ElementsAre(3, 2, 3));
}

v1::MicroBatchLoad Load(int share, int per_step, double seconds) {
  v1::MicroBatchLoad load;
  load.set_share(share);
  load.set_per_step(per_step);
  load.set_seconds(seconds);
  return load;
}

std::vector<v1::Straggler> Flagged(int rank) {
  v1::Straggler s;
  s.set_rank(rank);
  return {s};
}

// `steps` steps of every rank with `shares` and seconds per micro-batch
// `seconds`, from step `first`.
void Feed(ShareBalancer* balancer, const std::vector<int>& shares,
          const std::vector<double>& seconds, int steps, int first = 1) {
  const int total = std::accumulate(shares.begin(), shares.end(), 0);
  for (int step = first; step < first + steps; ++step) {
    for (size_t r = 0; r < shares.size(); ++r) {
      balancer->Observe(static_cast<int>(r), step,
                        Load(shares[r], total, seconds[r]));
    }
  }
}

TEST(ShareBalancerTest, MovesMicroBatchesAwayFromASlowRankOnceFlagged) {
  ShareBalancer balancer(3);
  Feed(&balancer, {8, 8, 8}, {0.001, 0.001, 0.003}, ShareBalancer::kWindow - 1);
  EXPECT_FALSE(balancer.Decide(Flagged(2)).has_value()) << "too few reports";
  Feed(&balancer, {8, 8, 8}, {0.001, 0.001, 0.003}, 1, ShareBalancer::kWindow);
  EXPECT_FALSE(balancer.Decide({}).has_value()) << "nobody flagged";
  std::optional<ShareBalancer::Proposal> p = balancer.Decide(Flagged(2));
  ASSERT_TRUE(p.has_value());
  // max(a, b, 3c) with a + b + c = 24 is least at 11: c = 3.
  EXPECT_EQ(p->shares[2], 3);
  EXPECT_EQ(p->shares[0] + p->shares[1], 21);
  EXPECT_THAT(p->verdict, HasSubstr("rank 2 takes 3.0x as long per "
                                    "micro-batch as rank 0: shares "));
  EXPECT_THAT(p->verdict, HasSubstr("of 24 (were 8,8,8), the slowest rank's "
                                    "compute 24.0ms -> 11.0ms a step"));
}

TEST(ShareBalancerTest, MovesThemBackWhenTheStragglerRecovers) {
  ShareBalancer balancer(3);
  Feed(&balancer, {11, 10, 3}, {0.001, 0.001, 0.001}, ShareBalancer::kWindow);
  // Rank 0 carries the most now, and is the one flagged.
  std::optional<ShareBalancer::Proposal> p = balancer.Decide(Flagged(0));
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->shares, ElementsAre(8, 8, 8));
}

TEST(ShareBalancerTest, NoProposalForASmallGainOrTooFewMicroBatches) {
  ShareBalancer close(3);
  Feed(&close, {8, 8, 8}, {0.001, 0.001, 0.00105}, ShareBalancer::kWindow);
  EXPECT_FALSE(close.Decide(Flagged(2)).has_value());
  ShareBalancer few(3);
  Feed(&few, {2, 2, 2}, {0.001, 0.001, 0.003}, ShareBalancer::kWindow);
  EXPECT_FALSE(few.Decide(Flagged(2)).has_value());
}

TEST(ShareBalancerTest, ADifferentDivisionStartsTheAverageOver) {
  ShareBalancer balancer(2);
  Feed(&balancer, {8, 8}, {0.001, 0.003}, ShareBalancer::kWindow);
  ASSERT_TRUE(balancer.Decide(Flagged(1)).has_value());
  // Rank 1 reports another division (a new round's): its average restarts.
  balancer.Observe(1, 100, Load(4, 16, 0.003));
  EXPECT_FALSE(balancer.Decide(Flagged(1)).has_value());
  // Old or malformed reports are ignored.
  balancer.Observe(0, 3, Load(8, 16, 0.001));
  balancer.Observe(0, 101, Load(0, 16, 0.001));
  balancer.Observe(0, 102, Load(8, 16, -1));
  EXPECT_FALSE(balancer.Decide(Flagged(1)).has_value());
}

}  // namespace
}  // namespace gradsync
