#include "server/heartbeat_pacer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace gradsync {
namespace {

constexpr double kRate = 100;  // turns 10 ms apart for one job
constexpr absl::Duration kSpacing = absl::Milliseconds(10);
const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(HeartbeatPacerTest, OneJobsTurnsAreSpacedByTheRate) {
  HeartbeatPacer pacer(kRate);
  EXPECT_EQ(pacer.Turn("a", 1, kStart), kStart);
  EXPECT_EQ(pacer.Turn("a", 1, kStart), kStart + kSpacing);
  // A node's message of 3 heartbeats takes 3 turns.
  EXPECT_EQ(pacer.Turn("a", 3, kStart), kStart + 2 * kSpacing);
  EXPECT_EQ(pacer.Turn("a", 1, kStart), kStart + 5 * kSpacing);
  // Read after its line ended: at once.
  EXPECT_EQ(pacer.Turn("a", 1, kStart + absl::Seconds(1)),
            kStart + absl::Seconds(1));
}

TEST(HeartbeatPacerTest, AMessageOfNoHeartbeatsNeverWaits) {
  HeartbeatPacer pacer(kRate);
  for (int i = 0; i < 10; ++i) pacer.Turn("a", 1, kStart);
  EXPECT_EQ(pacer.Turn("a", 0, kStart), kStart);
  EXPECT_EQ(pacer.WaitsAt(kStart).jobs.count("a"), 1u);
}

TEST(HeartbeatPacerTest, AJobBelowItsShareWaitsForNobody) {
  HeartbeatPacer pacer(kRate);
  // A flood: a second of turns at once.
  for (int i = 0; i < 100; ++i) pacer.Turn("flood", 1, kStart);
  // Three members of another job, a heartbeat each every 200 ms.
  for (int beat = 0; beat < 5; ++beat) {
    const absl::Time now = kStart + absl::Milliseconds(5 + 200 * beat);
    for (int member = 0; member < 3; ++member) {
      const absl::Time turn = pacer.Turn("small", 1, now);
      EXPECT_LE(turn, now + 2 * 2 * kSpacing)
          << "beat " << beat << ", member " << member
          << ": behind at most its own two others, at its share";
    }
  }
  // The flood's next message waits for its own line, longer by the turns
  // the small job took while sharing.
  EXPECT_GE(pacer.Turn("flood", 1, kStart + absl::Milliseconds(1)),
            kStart + absl::Seconds(1));
}

TEST(HeartbeatPacerTest, JobsWithLinesShareTheRateEqually) {
  HeartbeatPacer pacer(kRate);
  std::vector<absl::Time> a;
  std::vector<absl::Time> b;
  for (int i = 0; i < 50; ++i) {
    a.push_back(pacer.Turn("a", 1, kStart));
    b.push_back(pacer.Turn("b", 1, kStart));
  }
  // Each job's turns are two spacings apart once both wait: 100 a second
  // in all.
  for (int i = 2; i < 50; ++i) {
    EXPECT_EQ(a[i] - a[i - 1], 2 * kSpacing) << i;
    EXPECT_EQ(b[i] - b[i - 1], 2 * kSpacing) << i;
  }
  EXPECT_LE(a.back() - kStart, absl::Seconds(1));
  EXPECT_GE(a.back() - kStart, absl::Milliseconds(970));
}

TEST(HeartbeatPacerTest, TheCapHoldsAcrossManyJobs) {
  HeartbeatPacer pacer(kRate);
  constexpr int kJobs = 10;
  int before_a_second = 0;
  for (int i = 0; i < 30; ++i) {
    for (int job = 0; job < kJobs; ++job) {
      const absl::Time turn = pacer.Turn(absl::StrCat("job", job), 1, kStart);
      if (turn < kStart + absl::Seconds(1)) ++before_a_second;
    }
  }
  // 100 a second, and each job's first turn at once.
  EXPECT_LE(before_a_second, 100 + kJobs);
  EXPECT_GE(before_a_second, 100);
}

// Turns already given stay: b's share comes on top of a's line, given at
// the whole rate before b started, until that line has run; from then on
// the two share the cap.
TEST(HeartbeatPacerTest, AJobStartingBesideALongLineGetsItsShareOnTop) {
  HeartbeatPacer pacer(kRate);
  for (int i = 0; i < 100; ++i) pacer.Turn("a", 1, kStart);  // 1 s of turns
  std::vector<absl::Time> b;
  for (int i = 0; i < 100; ++i) {
    b.push_back(pacer.Turn("b", 1, kStart + absl::Milliseconds(1)));
  }
  EXPECT_EQ(b.front(), kStart + absl::Milliseconds(1));
  EXPECT_EQ(b[1] - b[0], 2 * kSpacing) << "b's share: half the rate";
  const absl::Time a_next = pacer.Turn("a", 1, kStart + absl::Milliseconds(2));
  EXPECT_EQ(a_next, kStart + absl::Seconds(1)) << "a's given turns stay";
  EXPECT_EQ(pacer.Turn("a", 1, kStart + absl::Milliseconds(2)) - a_next,
            2 * kSpacing)
      << "a's next turns at its share";
}

TEST(HeartbeatPacerTest, ALineThatEndedNoLongerShares) {
  HeartbeatPacer pacer(kRate);
  pacer.Turn("a", 1, kStart);
  // a's line ended 10 ms in; b alone has the whole rate.
  const absl::Time later = kStart + absl::Seconds(1);
  EXPECT_EQ(pacer.Turn("b", 1, later), later);
  EXPECT_EQ(pacer.Turn("b", 1, later), later + kSpacing);
}

TEST(HeartbeatPacerTest, WaitsNameEachJobsLine) {
  HeartbeatPacer pacer(kRate);
  for (int i = 0; i < 10; ++i) pacer.Turn("flood", 1, kStart);
  pacer.Turn("small", 1, kStart);  // its turn is now: it waits for nothing
  HeartbeatPacer::Waits waits = pacer.WaitsAt(kStart);
  ASSERT_EQ(waits.jobs.size(), 1u);
  EXPECT_EQ(waits.jobs["flood"], 9 * kSpacing);
  EXPECT_EQ(waits.longest, 9 * kSpacing);
  waits = pacer.WaitsAt(kStart + 4 * kSpacing);
  EXPECT_EQ(waits.jobs["flood"], 5 * kSpacing);
  waits = pacer.WaitsAt(kStart + absl::Seconds(1));
  EXPECT_TRUE(waits.jobs.empty());
  EXPECT_EQ(waits.longest, absl::ZeroDuration());
}

}  // namespace
}  // namespace gradsync
