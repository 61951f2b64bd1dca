#include "common/clock.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(FakeClockTest, StartsAtTheDocumentedDefaultTime) {
  FakeClock clock;
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1767225600));  // 2026-01-01
}

TEST(FakeClockTest, StartsAtTheGivenTime) {
  const absl::Time start = absl::FromUnixSeconds(42);
  FakeClock clock(start);
  EXPECT_EQ(clock.Now(), start);
}

TEST(FakeClockTest, DoesNotMoveOnItsOwn) {
  FakeClock clock;
  const absl::Time first = clock.Now();
  EXPECT_EQ(clock.Now(), first);
  EXPECT_EQ(clock.Now(), first);
}

TEST(FakeClockTest, AdvanceMovesForwardByExactlyTheGivenDuration) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(1500));
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(clock.Now(),
            start + absl::Milliseconds(1500) + absl::Nanoseconds(1));
}

TEST(FakeClockTest, AdvanceByZeroKeepsTheTime) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.Now(), start);
}

TEST(FakeClockTest, ConcurrentAdvancesAllCount) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&clock] {
      for (int i = 0; i < 1000; ++i) clock.Advance(absl::Milliseconds(1));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(clock.Now(), start + absl::Seconds(8));
}

TEST(FakeClockDeathTest, AdvancingBackwardsIsAnInvariantViolation) {
  FakeClock clock;
  EXPECT_DEATH(clock.Advance(-absl::Seconds(1)), "a clock cannot go back");
}

TEST(RealClockTest, IsASingletonThatTracksTheSystemTime) {
  EXPECT_EQ(RealClock::Get(), RealClock::Get());
  const absl::Time before = absl::Now();
  const absl::Time now = RealClock::Get()->Now();
  const absl::Time after = absl::Now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, after);
}

}  // namespace
}  // namespace gradsync
