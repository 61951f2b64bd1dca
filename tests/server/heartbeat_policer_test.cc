#include "server/heartbeat_policer.h"

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

HeartbeatPolicer::Asked Members(int members, absl::Duration interval) {
  HeartbeatPolicer::Asked asked;
  asked.members = members;
  asked.rate = members * absl::FDivDuration(absl::Seconds(1), interval);
  return asked;
}

// A stream's messages: one sent every `every` (from kStart), each read no
// earlier than the previous one was handled, as the stream reads them.
// Returns how many were handled by `end`.
int64_t HandledBy(HeartbeatPolicer* policer, const HeartbeatPolicer::Asked& asked,
                  int heartbeats, absl::Duration every, absl::Time end) {
  int64_t handled = 0;
  absl::Time free = kStart;  // when the stream reads its next message
  for (absl::Time sent = kStart; sent < end; sent += every) {
    const absl::Time read = std::max(sent, free);
    if (read >= end) break;
    free = policer->Admit(heartbeats, asked, read);
    if (free < end) ++handled;
  }
  return handled;
}

TEST(HeartbeatPolicerTest, AStreamNotYetToldAnIntervalIsNotHeldBack) {
  HeartbeatPolicer policer;
  for (int i = 0; i < 1000; ++i) {
    const absl::Time now = kStart + absl::Microseconds(i);
    EXPECT_EQ(policer.Admit(1, HeartbeatPolicer::Asked(), now), now);
  }
  EXPECT_EQ(policer.held(), 0);
}

class ObedientTest : public ::testing::TestWithParam<absl::Duration> {};

// As a HealthReporter sends: each heartbeat one interval after the last
// one, late by up to 30% of it (a loaded worker's timer), and arriving up
// to half an interval later still (the network; in order), with the extras
// the protocol allows: a heartbeat at once with the stacks a hang verdict
// asked for (the next one an interval after it), and one more at the old
// interval after the coordinator told a longer one.
TEST_P(ObedientTest, IsNeverHeldBack) {
  const absl::Duration interval = GetParam();
  HeartbeatPolicer policer;
  HeartbeatPolicer::Asked asked = Members(1, interval);
  absl::Duration every = interval;  // what the worker was told
  absl::Time sent = kStart;
  absl::Time arrived = kStart;
  uint32_t seed = 12345;
  auto fraction = [&seed](double most) {
    seed = seed * 1103515245 + 12345;
    return most * static_cast<double>((seed >> 16) % 1001) / 1000;
  };
  auto send = [&](absl::Time at) {
    sent = at;
    arrived = std::max(arrived, sent + every * fraction(0.5));
    return policer.Admit(1, asked, arrived) == arrived;
  };
  for (int i = 0; i < 2000; ++i) {
    EXPECT_TRUE(send(sent + every * (1 + fraction(0.3)))) << "heartbeat " << i;
    if (i % 100 == 50) {
      EXPECT_TRUE(send(sent + absl::Milliseconds(1))) << "stacks " << i;
    }
    if (i == 1000) {  // its answer told 16x the interval
      asked = Members(1, interval * 16);
      EXPECT_TRUE(send(sent + every)) << "one more at the old interval";
      every = interval * 16;
    }
  }
  EXPECT_EQ(policer.held(), 0);
}

INSTANTIATE_TEST_SUITE_P(Intervals, ObedientTest,
                         ::testing::Values(absl::Milliseconds(100),
                                           absl::Seconds(1),
                                           absl::Seconds(16)));

// 8 members on one node's stream, every one at its interval: 8 heartbeats
// a message, never held back.
TEST(HeartbeatPolicerTest, AnObedientNodeIsNeverHeldBack) {
  HeartbeatPolicer policer;
  const HeartbeatPolicer::Asked asked = Members(8, absl::Seconds(1));
  EXPECT_EQ(HandledBy(&policer, asked, 8, absl::Seconds(1),
                      kStart + absl::Seconds(100)),
            100);
  EXPECT_EQ(policer.held(), 0);
}

// A stream of `members` asked for one heartbeat each `interval`, sending
// every member's every `every` (one message), for `run`: read at twice the
// asked rate, plus the bucket's 8 heartbeats a member at the start.
struct TooFast {
  int members;
  absl::Duration interval;
  absl::Duration every;
  absl::Duration run;
  int64_t at_least;
  int64_t at_most;
};

class TooFastTest : public ::testing::TestWithParam<TooFast> {};

TEST_P(TooFastTest, IsReadAtTheTolerance) {
  const TooFast& c = GetParam();
  HeartbeatPolicer policer;
  const int64_t handled =
      HandledBy(&policer, Members(c.members, c.interval), c.members, c.every,
                kStart + c.run);
  EXPECT_GE(handled, c.at_least);
  EXPECT_LE(handled, c.at_most);
  EXPECT_GT(policer.held(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Streams, TooFastTest,
    ::testing::Values(
        // A member 10x too fast: 2 a second and 8, not the 1,000 sent.
        TooFast{1, absl::Seconds(1), absl::Milliseconds(100),
                absl::Seconds(100), 205, 209},
        // 8 members on one node's stream asked for every 2 s (4 a second
        // together) sending every 0.5 s (16 a second): 8 a second and 64,
        // 88 messages of 8 in 80 s (of the 160 sent).
        TooFast{8, absl::Seconds(2), absl::Milliseconds(500),
                absl::Seconds(80), 86, 89}));

TEST(HeartbeatPolicerTest, AShorterIntervalTakesEffectAtOnce) {
  HeartbeatPolicer policer;
  const HeartbeatPolicer::Asked slow = Members(1, absl::Seconds(16));
  absl::Time now = kStart;
  // A burst at once empties the bucket; at 16 s it would take 8 s to
  // refill one heartbeat.
  for (int i = 0; i < HeartbeatPolicer::kBurstPerMember; ++i) {
    EXPECT_EQ(policer.Admit(1, slow, now), now) << i;
  }
  // Told 1 s (the load eased): what it sends at that pace is read at once.
  const HeartbeatPolicer::Asked fast = Members(1, absl::Seconds(1));
  for (int i = 0; i < 20; ++i) {
    now += absl::Seconds(1);
    EXPECT_EQ(policer.Admit(1, fast, now), now) << i;
  }
}

TEST(HeartbeatPolicerTest, AHeldMessageWaitsUntilTheBucketHasRefilled) {
  HeartbeatPolicer policer;
  const HeartbeatPolicer::Asked asked = Members(1, absl::Seconds(1));
  for (int i = 0; i < HeartbeatPolicer::kBurstPerMember; ++i) {
    EXPECT_EQ(policer.Admit(1, asked, kStart), kStart) << i;
  }
  // Empty: one heartbeat takes 1 / 2 s to refill.
  EXPECT_EQ(policer.Admit(1, asked, kStart), kStart + absl::Milliseconds(500));
  EXPECT_EQ(policer.Admit(1, asked, kStart + absl::Milliseconds(500)),
            kStart + absl::Milliseconds(1000));
  EXPECT_EQ(policer.held(), 2);
}

}  // namespace
}  // namespace gradsync
