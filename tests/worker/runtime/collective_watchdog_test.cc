// CollectiveWatchdog on a fake clock over a scripted backend: the timeout
// follows the round's step times (a job of 50 ms steps gives up after 1 s,
// one of 10 s steps not before 100 s), is left to the backend before enough
// steps and after a checkpoint step, fires once; and its own thread aborts
// a real-time backend.
#include "worker/runtime/collective_watchdog.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scripted_backend.h"
#include "worker/backend/observed_backend.h"

namespace gradsync {
namespace {

using ::gradsync::testing::ScriptedBackend;
using ::testing::HasSubstr;

class CollectiveWatchdogTest : public ::testing::Test {
 protected:
  CollectiveWatchdogOptions Options() {
    CollectiveWatchdogOptions options;  // x10, up to 5 min
    options.min = absl::Seconds(1);
    options.check_every = absl::ZeroDuration();
    options.clock = &clock_;
    return options;
  }
  void Steps(CollectiveWatchdog* watchdog, int n, absl::Duration each) {
    for (int i = 0; i < n; ++i) watchdog->AddStep(each, false);
  }

  FakeClock clock_;
  ScriptedBackend inner_;
  ObservedBackend observed_{&inner_, &clock_};
};

TEST_F(CollectiveWatchdogTest, FiftyMillisecondStepsGiveUpOnACollectiveAfterASecond) {
  CollectiveWatchdog watchdog(&observed_, Options());
  Steps(&watchdog, SelfSetTimeout::kMinSamples, absl::Milliseconds(50));
  ASSERT_EQ(watchdog.timeout(), absl::Seconds(1));
  observed_.Barrier();  // #1, never finished: a hung peer
  clock_.Advance(absl::Milliseconds(900));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 0);
  EXPECT_TRUE(watchdog.fired().ok());
  clock_.Advance(absl::Milliseconds(200));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 1);
  EXPECT_EQ(watchdog.fired().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(watchdog.fired().message(),
              HasSubstr("collective #1 has not completed after 1.1s, longer "
                        "than the self-set collective timeout of 1s"));
  clock_.Advance(absl::Seconds(5));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 1) << "once";
}

TEST_F(CollectiveWatchdogTest, TenSecondStepsAreNeverCutAtAMinute) {
  CollectiveWatchdog watchdog(&observed_, Options());
  Steps(&watchdog, SelfSetTimeout::kMinSamples, absl::Seconds(10));
  ASSERT_EQ(watchdog.timeout(), absl::Seconds(100));
  observed_.Barrier();
  clock_.Advance(absl::Seconds(60));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 0);
  clock_.Advance(absl::Seconds(41));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 1);
}

TEST_F(CollectiveWatchdogTest, ACollectiveThatCompletedIsNotWatched) {
  CollectiveWatchdog watchdog(&observed_, Options());
  Steps(&watchdog, SelfSetTimeout::kMinSamples, absl::Milliseconds(50));
  observed_.Barrier();
  clock_.Advance(absl::Milliseconds(500));
  observed_.Barrier();
  inner_.works[0]->Finish(absl::OkStatus());
  clock_.Advance(absl::Milliseconds(800));  // #1 issued 1.3 s ago, #2 0.8 s
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 0);
}

TEST_F(CollectiveWatchdogTest, TheBackendsTimeoutRulesUntilEnoughSteps) {
  CollectiveWatchdog watchdog(&observed_, Options());
  Steps(&watchdog, SelfSetTimeout::kMinSamples - 1, absl::Milliseconds(50));
  EXPECT_FALSE(watchdog.timeout().has_value());
  observed_.Barrier();
  clock_.Advance(absl::Hours(1));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 0);
}

// Rank 0 writes a checkpoint alone after such a step; the others wait for
// it in their next collective, which may take far longer than a step.
TEST_F(CollectiveWatchdogTest, TheCollectiveAfterACheckpointStepIsNotCut) {
  CollectiveWatchdog watchdog(&observed_, Options());
  Steps(&watchdog, SelfSetTimeout::kMinSamples, absl::Milliseconds(50));
  watchdog.AddStep(absl::Milliseconds(50), /*checkpoint=*/true);
  EXPECT_FALSE(watchdog.timeout().has_value());
  observed_.Barrier();
  clock_.Advance(absl::Seconds(30));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 0);
  inner_.works[0]->Finish(absl::OkStatus());
  watchdog.AddStep(absl::Milliseconds(50), false);
  observed_.Barrier();
  clock_.Advance(absl::Seconds(2));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 1) << "watched again from the next step";
}

TEST_F(CollectiveWatchdogTest, TheFloorIsTenSecondsByDefault) {
  CollectiveWatchdogOptions options;
  options.check_every = absl::ZeroDuration();
  options.clock = &clock_;
  CollectiveWatchdog watchdog(&observed_, options);
  Steps(&watchdog, SelfSetTimeout::kMinSamples, absl::Milliseconds(50));
  EXPECT_EQ(watchdog.timeout(), absl::Seconds(10));
}

// A backend timeout below the floor caps it.
TEST_F(CollectiveWatchdogTest, NeverLongerThanTheBackendsTimeout) {
  CollectiveWatchdogOptions options = Options();
  options.min = absl::Seconds(10);
  options.max = absl::Seconds(3);
  CollectiveWatchdog watchdog(&observed_, options);
  Steps(&watchdog, SelfSetTimeout::kMinSamples, absl::Milliseconds(50));
  EXPECT_EQ(watchdog.timeout(), absl::Seconds(3));
}

TEST_F(CollectiveWatchdogTest, FactorZeroTurnsItOff) {
  CollectiveWatchdogOptions options = Options();
  options.factor = 0;
  CollectiveWatchdog watchdog(&observed_, options);
  Steps(&watchdog, 100, absl::Milliseconds(50));
  EXPECT_FALSE(watchdog.timeout().has_value());
  observed_.Barrier();
  clock_.Advance(absl::Hours(1));
  watchdog.Check();
  EXPECT_EQ(inner_.aborts, 0);
}

// The thread, on the real clock: 1 ms steps give the minimum, 50 ms.
TEST(CollectiveWatchdogThreadTest, ItsThreadAbortsAnOverdueCollective) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  CollectiveWatchdogOptions options;
  options.min = absl::Milliseconds(50);
  options.check_every = absl::Milliseconds(10);
  CollectiveWatchdog watchdog(&observed, options);
  for (int i = 0; i < SelfSetTimeout::kMinSamples; ++i) {
    watchdog.AddStep(absl::Milliseconds(1), false);
  }
  observed.Barrier();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (inner.aborts == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(inner.aborts, 1);
  EXPECT_EQ(watchdog.fired().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace gradsync
