#include "server/round_lifecycle.h"

#include <set>
#include <utility>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using P = RoundPhase;

constexpr P kAll[] = {P::kForming,         P::kLastCall,   P::kRunning,
                      P::kReformRequested, P::kSuperseded, P::kEnded};

// Exactly the transitions drawn in round_lifecycle.h are allowed.
TEST(RoundPhaseTest, OnlyTheDrawnTransitionsAreAllowed) {
  const std::set<std::pair<P, P>> drawn = {
      {P::kForming, P::kLastCall},         {P::kSuperseded, P::kLastCall},
      {P::kLastCall, P::kForming},         {P::kLastCall, P::kSuperseded},
      {P::kForming, P::kRunning},          {P::kLastCall, P::kRunning},
      {P::kSuperseded, P::kRunning},       {P::kRunning, P::kReformRequested},
      {P::kRunning, P::kSuperseded},       {P::kReformRequested, P::kSuperseded},
      {P::kForming, P::kEnded},            {P::kLastCall, P::kEnded},
      {P::kRunning, P::kEnded},            {P::kReformRequested, P::kEnded},
      {P::kSuperseded, P::kEnded},
  };
  for (P from : kAll) {
    for (P to : kAll) {
      EXPECT_EQ(RoundPhaseMayBecome(from, to), drawn.count({from, to}) == 1)
          << RoundPhaseName(from) << " -> " << RoundPhaseName(to);
    }
  }
}

TEST(RoundPhaseTest, OnlyRunningPhasesRun) {
  for (P phase : kAll) {
    EXPECT_EQ(RoundRuns(phase),
              phase == P::kRunning || phase == P::kReformRequested)
        << RoundPhaseName(phase);
  }
}

TEST(CheckRoundIsLiveTest, TheLiveRoundIsOk) {
  EXPECT_TRUE(CheckRoundIsLive("train", 3, 3, true).ok());
}

TEST(CheckRoundIsLiveTest, AnOlderOrSupersededRoundIsOver) {
  absl::Status older = CheckRoundIsLive("train", 2, 3, true);
  EXPECT_EQ(older.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(older.message(),
              HasSubstr("round 2 of job 'train' is over (latest round: 3, "
                        "running): rejoin"));
  absl::Status superseded = CheckRoundIsLive("train", 3, 3, false);
  EXPECT_EQ(superseded.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(superseded.message(),
              HasSubstr("superseded, the next one is forming"));
}

TEST(CheckRoundIsLiveTest, ANewerRoundHasNotClosed) {
  absl::Status newer = CheckRoundIsLive("train", 4, 3, false);
  EXPECT_EQ(newer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(newer.message(),
              HasSubstr("round 4 of job 'train' has not closed (latest "
                        "closed round: 3)"));
}

}  // namespace
}  // namespace gradsync
