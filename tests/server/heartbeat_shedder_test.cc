#include "server/heartbeat_shedder.h"

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

using Counts = HeartbeatShedder::Counts;
using Backlog = HeartbeatShedder::Backlog;

constexpr absl::Duration kWindow = absl::Seconds(1);

// `n` heartbeats with a gap, `late` of them late; all from members told
// the current factor unless `current` is false.
Counts Beats(int64_t n, int64_t late, bool current = true) {
  Counts c;
  c.heartbeats = n;
  c.samples = n;
  c.late = late;
  if (current) {
    c.current_samples = n;
    c.current_late = late;
  }
  return c;
}

// `n` heartbeats that opened a stream (no gap to judge).
Counts Opened(int64_t n) {
  Counts c;
  c.heartbeats = n;
  return c;
}

// Members that send `full_rate` heartbeats a second at their jobs' own
// intervals, asked for `factor`.
Backlog Waiting(absl::Duration delay, double full_rate = 0,
                int64_t members = 0, int64_t overdue = 0, int factor = 1) {
  Backlog b;
  b.delay = delay;
  b.full_rate = full_rate;
  b.expected_rate = full_rate / factor;
  b.members = members;
  b.overdue = overdue;
  return b;
}

// A shedder on a time the test steps, one Update per window.
class HeartbeatShedderTest : public ::testing::Test {
 protected:
  static HeartbeatSheddingConfig Config() {
    HeartbeatSheddingConfig config;
    config.max_delay = absl::Milliseconds(500);
    return config;
  }

  void Make(HeartbeatSheddingConfig config = Config()) {
    shedder_ = std::make_unique<HeartbeatShedder>(config, now_);
  }

  // Ends one window with `counts` handled in it and `backlog` at its end.
  void Window(const Counts& counts, const Backlog& backlog = Backlog()) {
    now_ += kWindow;
    shedder_->Update(now_, counts, backlog);
  }

  // `windows` on-time windows of 1000 heartbeats each.
  void Calm(int windows, int64_t per_window = 1000) {
    for (int i = 0; i < windows; ++i) {
      Window(Beats(per_window, 0), Waiting(absl::ZeroDuration(), per_window));
    }
  }

  // `windows` windows behind at `factor` while members send 2,000/s at
  // their own intervals: 500 handled, 10 late, 300 ms of queue delay (the
  // first `first_delay`); neither calm nor past an escalation threshold.
  void StayBehind(int windows, int factor,
                  absl::Duration first_delay = absl::Milliseconds(300)) {
    for (int i = 0; i < windows; ++i) {
      Window(Beats(500, 10),
             Waiting(i == 0 ? first_delay : absl::Milliseconds(300), 2000, 0,
                     0, factor));
    }
  }

  int factor() const { return shedder_->factor(); }

  absl::Time now_ = absl::FromUnixSeconds(1767225600);
  std::unique_ptr<HeartbeatShedder> shedder_;
};

TEST_F(HeartbeatShedderTest, HeartbeatsOnTimeNeverShed) {
  Make();
  Calm(10);
  EXPECT_EQ(factor(), 1);
  EXPECT_FALSE(shedder_->state().behind);
  EXPECT_EQ(shedder_->state().shed_periods, 0);
  EXPECT_EQ(shedder_->Allowance(now_), absl::ZeroDuration());
}

TEST_F(HeartbeatShedderTest, TooFewHeartbeatsAreNotJudged) {
  Make();
  Window(Beats(99, 99));
  EXPECT_EQ(factor(), 1);
  EXPECT_FALSE(shedder_->state().behind);
}

TEST_F(HeartbeatShedderTest, LateHeartbeatsDoubleTheFactorUpToTheMax) {
  Make();
  for (int expected : {2, 4, 8, 16, 16}) {
    Window(Beats(1000, 200));
    EXPECT_EQ(factor(), expected);
  }
  const HeartbeatShedder::State state = shedder_->state();
  EXPECT_EQ(state.shed_periods, 1) << "one period, however many steps";
  EXPECT_TRUE(state.behind);
  EXPECT_DOUBLE_EQ(state.capacity, 1000);
  EXPECT_DOUBLE_EQ(state.late_fraction, 0.2);
  EXPECT_EQ(state.shedding_since, now_ - 4 * kWindow);
}

TEST_F(HeartbeatShedderTest, LateHeartbeatsOfMembersNotYetToldDoNotEscalate) {
  Make();
  Window(Beats(1000, 500));
  ASSERT_EQ(factor(), 2);
  // Members still on the old interval are late; those told are on time.
  Counts mixed = Beats(500, 0);
  mixed += Beats(500, 400, /*current=*/false);
  Window(mixed);
  EXPECT_EQ(factor(), 2);
  EXPECT_TRUE(shedder_->state().behind) << "40% late: not calm yet";
}

TEST_F(HeartbeatShedderTest, AQueueDelayIsBehindAtOnceAndShedsToWhatFits) {
  Make();
  // Mid-window: heartbeats already wait 2 s.
  now_ += absl::Milliseconds(300);
  shedder_->Update(now_, Beats(150, 0), Waiting(absl::Seconds(2), 2000));
  EXPECT_TRUE(shedder_->state().behind);
  EXPECT_EQ(factor(), 1) << "the factor is decided per window";
  EXPECT_EQ(shedder_->Allowance(now_), absl::Seconds(2));
  EXPECT_EQ(shedder_->Allowance(now_ + absl::Seconds(3)),
            absl::Seconds(5))
      << "the time behind, counted from the oldest waiting heartbeat";
  // At the window's end: 500 handled in it, members send 2,000/s. 2,000 / 8
  // = 250 fits in 0.7 x 500; 2,000 / 4 does not.
  now_ += absl::Milliseconds(700);
  shedder_->Update(now_, Beats(350, 0), Waiting(absl::Seconds(2), 2000));
  EXPECT_EQ(factor(), 8);
  EXPECT_DOUBLE_EQ(shedder_->state().capacity, 500);
  EXPECT_EQ(shedder_->state().shed_periods, 1);
}

// A machine busy with something else delays the coordinator's queues, but
// three members heartbeating once a second are not the load: the factor
// stays, so their failures are still found on time; the allowance for the
// time behind still protects them from being blamed.
TEST_F(HeartbeatShedderTest, AFewHeartbeatsAreNotShedForAQueueDelay) {
  Make();
  for (int i = 0; i < 5; ++i) {
    Window(Beats(1, 0), Waiting(absl::Seconds(1), 3));
    EXPECT_EQ(factor(), 1);
    EXPECT_TRUE(shedder_->state().behind);
  }
  EXPECT_GT(shedder_->Allowance(now_), absl::ZeroDuration());
  EXPECT_EQ(shedder_->state().shed_periods, 0);
}

TEST_F(HeartbeatShedderTest, ADrainingBacklogNeitherEscalatesNorSpeedsUp) {
  Make();
  Window(Beats(500, 0), Waiting(absl::Seconds(2), 2000));
  ASSERT_EQ(factor(), 8);
  // Still a backlog, but what members send now (250/s) fits: it drains
  // (2 s of queue delay, 1.8 s, ...); no more slowing down, and no
  // speeding up before it has.
  for (int i = 0; i < 9; ++i) {
    Window(Beats(500, 0),
           Waiting(absl::Milliseconds(2000 - 200 * i), 2000, 0, 0, 8));
    EXPECT_EQ(factor(), 8);
    EXPECT_TRUE(shedder_->state().behind);
  }
}

// A backlog 8 s deep (the start of a flood) drains over 20 windows, well
// past stuck_windows, at arrivals that fit: not stuck, since a backlog that
// deep may take 8 s / (1 - headroom) to drain.
TEST_F(HeartbeatShedderTest, ADeepBacklogDrainingSlowlyIsNotStuck) {
  Make();
  Window(Beats(500, 0), Waiting(absl::Seconds(8), 2000));
  ASSERT_EQ(factor(), 8);
  for (int i = 0; i < 20; ++i) {
    Window(Beats(500, 0),
           Waiting(absl::Milliseconds(8000 - 390 * i), 2000, 0, 0, 8));
    EXPECT_EQ(factor(), 8) << "window " << i;
  }
}

// Members of one job send twice what they are asked (HeartbeatPolicer lets
// that much through): at the factor the asked intervals say fits, the
// coordinator stays behind (queue delay between max_delay / 4 and
// max_delay, nothing late enough to escalate), and every job's LOST
// deadlines would stay stretched. After stuck_windows such windows the
// factor doubles; then it is calm.
TEST_F(HeartbeatShedderTest, StayingBehindAtOneFactorDoublesIt) {
  Make();
  Window(Beats(500, 0), Waiting(absl::Seconds(2), 2000));
  ASSERT_EQ(factor(), 8);
  const int stuck = Config().stuck_windows;
  for (int i = 0; i < stuck; ++i) {
    EXPECT_EQ(factor(), 8) << "window " << i;
    StayBehind(1, 8);
    EXPECT_TRUE(shedder_->state().behind);
  }
  EXPECT_EQ(factor(), 16);
  // At 16 it drains; the count starts again at the new factor.
  for (int i = 0; i < stuck - 1; ++i) {
    Window(Beats(250, 5), Waiting(absl::Milliseconds(300), 2000, 0, 0, 16));
  }
  Calm(2, 250);  // the first still carries the last window's delay
  EXPECT_EQ(factor(), 16);
  EXPECT_FALSE(shedder_->state().behind);
}

// After doubling for staying behind, room to spare by the asked intervals
// is not trusted: the factor halves only as a probe, and a probe that
// stays behind again doubles the wait for the next one.
TEST_F(HeartbeatShedderTest, AfterStayingBehindItHalvesOnlyAsAProbe) {
  HeartbeatSheddingConfig config = Config();
  config.probe_windows = 5;
  Make(config);
  Window(Beats(500, 0), Waiting(absl::Seconds(2), 2000));
  ASSERT_EQ(factor(), 8);
  // An episode begins (600 ms queued) and goes on (300 ms).
  const absl::Duration begins = absl::Milliseconds(600);
  StayBehind(config.stuck_windows, 8, begins);
  ASSERT_EQ(factor(), 16);
  // 125/s handled, 2000 / 16 expected: twice that has room to spare, but
  // it waits for the probe (5 calm windows, the first carrying the last
  // window's delay).
  Calm(5, 125);
  EXPECT_EQ(factor(), 16);
  Calm(1, 125);
  EXPECT_EQ(factor(), 8);
  StayBehind(config.stuck_windows, 8, begins);
  ASSERT_EQ(factor(), 16);
  Calm(10, 125);
  EXPECT_EQ(factor(), 16) << "the next probe waits twice as long";
  Calm(1, 125);
  EXPECT_EQ(factor(), 8);
}

// A rack lost power while the coordinator was behind: its members are
// overdue and keep the episode going, but nothing waits and nothing is
// late: no reason to slow the others down further.
TEST_F(HeartbeatShedderTest, OverdueMembersDoNotCountAsStayingBehind) {
  Make();
  Window(Beats(1000, 0), Waiting(absl::Seconds(1), 1000));
  ASSERT_TRUE(shedder_->state().behind);
  const int started = factor();
  for (int i = 0; i < 2 * Config().stuck_windows; ++i) {
    Window(Beats(900, 0),
           Waiting(absl::ZeroDuration(), 1000, 1000, 100, started));
    EXPECT_TRUE(shedder_->state().behind);
  }
  EXPECT_EQ(factor(), started);
}

TEST_F(HeartbeatShedderTest, NeverStuckWhenDisabledByConfig) {
  HeartbeatSheddingConfig config = Config();
  config.stuck_windows = 0;
  Make(config);
  Window(Beats(500, 0), Waiting(absl::Seconds(2), 2000));
  ASSERT_EQ(factor(), 8);
  StayBehind(30, 8);
  EXPECT_EQ(factor(), 8);
}

TEST_F(HeartbeatShedderTest, SpeedsUpOnlyAfterCalmWindowsWithHeadroom) {
  Make();
  Window(Beats(1000, 1000));  // capacity estimate 1,000/s
  ASSERT_EQ(factor(), 2);
  // 300/s: doubling it leaves 30% headroom (600 <= 700), after 3 calm
  // windows.
  Calm(2, 300);
  EXPECT_EQ(factor(), 2);
  Calm(1, 300);
  EXPECT_EQ(factor(), 1);
  EXPECT_FALSE(shedder_->state().behind);
  EXPECT_EQ(shedder_->state().shed_periods, 1);
}

TEST_F(HeartbeatShedderTest, StaysSlowWithoutHeadroom) {
  Make();
  Window(Beats(1000, 1000));
  ASSERT_EQ(factor(), 2);
  // 400/s: doubling it (800) would not leave 30% headroom.
  Calm(20, 400);
  EXPECT_EQ(factor(), 2);
  EXPECT_FALSE(shedder_->state().behind);
}

TEST_F(HeartbeatShedderTest, AWindowInBetweenRestartsTheCalmCount) {
  Make();
  Window(Beats(1000, 1000));
  Calm(2, 300);
  Window(Beats(300, 30), Waiting(absl::ZeroDuration(), 300));  // 10% late
  Calm(2, 300);
  EXPECT_EQ(factor(), 2);
  Calm(1, 300);
  EXPECT_EQ(factor(), 1);
}

TEST_F(HeartbeatShedderTest, ProbesWithoutHeadroomAndWaitsLongerAfterAFailure) {
  HeartbeatSheddingConfig config = Config();
  config.probe_windows = 5;
  Make(config);
  Window(Beats(1000, 1000));
  ASSERT_EQ(factor(), 2);
  Calm(4, 600);  // no headroom
  EXPECT_EQ(factor(), 2);
  Calm(1, 600);  // the 5th: a probe
  EXPECT_EQ(factor(), 1);
  // It overloads again: back to 2, and the next probe waits twice as long.
  Window(Beats(1000, 500));
  ASSERT_EQ(factor(), 2);
  Calm(9, 600);
  EXPECT_EQ(factor(), 2);
  Calm(1, 600);
  EXPECT_EQ(factor(), 1);
}

TEST_F(HeartbeatShedderTest, OverdueMembersKeepAnEpisodeGoingAndEscalateIt) {
  Make();
  Window(Beats(1000, 0), Waiting(absl::Seconds(1), 1000));
  ASSERT_TRUE(shedder_->state().behind);
  const int started = factor();
  // The queues drained, but 30% of the members were not heard from for
  // 1.5 intervals: some connections are still starved.
  Window(Beats(700, 0),
         Waiting(absl::ZeroDuration(), 1000, 1000, 300, started));
  EXPECT_TRUE(shedder_->state().behind);
  EXPECT_EQ(factor(), 2 * started);
  EXPECT_GE(shedder_->Allowance(now_), 2 * kWindow);
  // Once heard from again, the episode ends.
  Window(Beats(1000, 0), Waiting(absl::ZeroDuration(), 500, 1000, 0));
  EXPECT_FALSE(shedder_->state().behind);
  EXPECT_EQ(shedder_->Allowance(now_), absl::ZeroDuration());
}

// A small job: a load spike began an episode; one of its 3 members then
// stopped (SIGSTOP: its stream open, silent). Once the queues are calm the
// episode ends, so that member's LOST deadline is not stretched by the
// time behind (a 3-member job hung this way was found only by its peers'
// collective watchdog, 10 s in, in a loaded full run).
TEST_F(HeartbeatShedderTest, ADeadMemberOfASmallJobDoesNotKeepAnEpisodeGoing) {
  Make();
  Window(Beats(3, 0), Waiting(absl::Seconds(1), 3, 3, 0));
  ASSERT_TRUE(shedder_->state().behind);
  // The window the delay ended in, then a calm one.
  for (int i = 0; i < 2; ++i) {
    Window(Beats(2, 0), Waiting(absl::ZeroDuration(), 3, 3, 1));
  }
  EXPECT_FALSE(shedder_->state().behind);
  EXPECT_EQ(shedder_->Allowance(now_), absl::ZeroDuration());
}

TEST_F(HeartbeatShedderTest, OverdueMembersAloneAreNotAnOverload) {
  Make();
  // 60% of the members went silent (a rack lost power); those left are on
  // time and nothing waits: they are failures to detect, not load to shed.
  for (int i = 0; i < 5; ++i) {
    Window(Beats(400, 0), Waiting(absl::ZeroDuration(), 1000, 1000, 600));
  }
  EXPECT_EQ(factor(), 1);
  EXPECT_FALSE(shedder_->state().behind);
  EXPECT_EQ(shedder_->Allowance(now_), absl::ZeroDuration());
}

// A job of 10,000 was heard a moment ago; 50,000 more members open their
// streams (the bench's start, where 257 of the first job were LOST): the
// coordinator reads the new streams ahead of the open ones, where no
// queue probe sees it.
TEST_F(HeartbeatShedderTest, AStormOfNewStreamsIsBehindWhileItStarvesOthers) {
  Make();
  Window(Opened(20000), Waiting(absl::ZeroDuration(), 10000, 10000, 0));
  ASSERT_TRUE(shedder_->state().behind);
  // Still opening; the first 10,000 are overdue, their streams unread.
  Counts storm = Opened(20000);
  storm += Beats(500, 0);
  Window(storm, Waiting(absl::ZeroDuration(), 30000, 30000, 10000));
  EXPECT_TRUE(shedder_->state().behind);
  EXPECT_GE(shedder_->Allowance(now_), 2 * kWindow);
  // The storm is over and every member heard again: the episode ends.
  Window(Beats(60000, 0), Waiting(absl::ZeroDuration(), 60000, 60000, 0));
  EXPECT_FALSE(shedder_->state().behind);
  EXPECT_EQ(shedder_->Allowance(now_), absl::ZeroDuration());
}

TEST_F(HeartbeatShedderTest, AStormThatStarvesNobodyEndsWithIt) {
  Make();
  Window(Opened(1000), Waiting(absl::ZeroDuration(), 1000, 1000, 0));
  ASSERT_TRUE(shedder_->state().behind);
  Window(Beats(1000, 0), Waiting(absl::ZeroDuration(), 1000, 1000, 0));
  EXPECT_FALSE(shedder_->state().behind);
  EXPECT_EQ(factor(), 1);
  EXPECT_EQ(shedder_->state().shed_periods, 0);
}

TEST_F(HeartbeatShedderTest, AFewNewStreamsAreNoStorm) {
  Make();
  Window(Opened(99), Waiting(absl::ZeroDuration(), 99, 0, 0));
  EXPECT_FALSE(shedder_->state().behind) << "fewer than min_samples";
  Counts some = Opened(150);
  some += Beats(1000, 0);
  Window(some, Waiting(absl::ZeroDuration(), 1150, 1000, 0));
  EXPECT_FALSE(shedder_->state().behind) << "13% of the heartbeats";
}

// Episodes begin at most once every 30 s in the log; the next one logged
// says how many were left out and what began each, so that a storm of new
// streams between two queue delays is not lost.
TEST_F(HeartbeatShedderTest, EpisodesLeftOutOfTheLogAreCountedByCause) {
  Make();
  const Backlog heard = Waiting(absl::ZeroDuration(), 1000, 1000, 0);
  ::testing::internal::CaptureStderr();
  // A window that ends with a queue delay is followed by one that is not
  // calm (its delay counts in it): two calm windows end the episode.
  Window(Beats(500, 0), Waiting(absl::Seconds(2), 2000));  // logged
  Calm(2);
  Window(Opened(1000), heard);  // within 30 s: left out
  Window(Beats(1000, 0), heard);
  Window(Opened(1000), heard);  // left out
  Window(Beats(1000, 0), heard);
  Window(Beats(500, 0), Waiting(absl::Seconds(2), 2000));  // left out
  Calm(2);
  now_ += absl::Seconds(30);
  Window(Opened(1000), heard);  // logged, with the three before
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("what arrives waits 2s in its queues"));
  EXPECT_THAT(log, HasSubstr("1000 of 1000 heartbeats opened a stream"));
  EXPECT_THAT(log, HasSubstr("(3 shorter episodes were not logged since the "
                             "last: 1 begun by a queue delay, 2 by new "
                             "streams)"));
}

TEST_F(HeartbeatShedderTest, DisabledNeverShedsButStillSeesItIsBehind) {
  HeartbeatSheddingConfig config = Config();
  config.enabled = false;
  Make(config);
  for (int i = 0; i < 3; ++i) {
    Window(Beats(1000, 800), Waiting(absl::Seconds(3), 5000));
  }
  EXPECT_EQ(factor(), 1);
  EXPECT_TRUE(shedder_->state().behind);
  EXPECT_EQ(shedder_->state().shed_periods, 0);
  EXPECT_EQ(shedder_->Allowance(now_), absl::ZeroDuration());
}

TEST(FairFactorsTest, ASmallJobBesideAFloodingOneKeepsItsInterval) {
  // 1,003/s at factor 8 must come to about 125/s: the job of 3/s sends
  // its 3, the flooding job gets the rest.
  EXPECT_THAT(HeartbeatShedder::FairFactors(8, {1000, 3}, 16),
              ::testing::ElementsAre(8, 1));
  EXPECT_THAT(HeartbeatShedder::FairFactors(8, {3, 1000}, 16),
              ::testing::ElementsAre(1, 8));
}

TEST(FairFactorsTest, OneJobAloneGetsTheWholeFactor) {
  for (int factor : {1, 2, 4, 8, 16}) {
    EXPECT_THAT(HeartbeatShedder::FairFactors(factor, {1000}, 16),
                ::testing::ElementsAre(factor));
  }
}

TEST(FairFactorsTest, EqualJobsShareEqually) {
  EXPECT_THAT(HeartbeatShedder::FairFactors(4, {500, 500, 500}, 16),
              ::testing::ElementsAre(4, 4, 4));
}

TEST(FairFactorsTest, JobsAboveTheirShareAreSlowedByHowFarAbove) {
  // 2,200/s at factor 4: 550/s shared by three: 100 fits, 550 - 100 = 450
  // left for two: 225 each; 600/4 = 150 and 1,500/8 = 188 fit (within a
  // quarter above).
  EXPECT_THAT(HeartbeatShedder::FairFactors(4, {100, 600, 1500}, 16),
              ::testing::ElementsAre(1, 4, 8));
  // At most max_factor, and idle jobs are never slowed.
  EXPECT_THAT(HeartbeatShedder::FairFactors(16, {0, 100000}, 16),
              ::testing::ElementsAre(1, 16));
}

}  // namespace
}  // namespace gradsync
