// The desync and straggler detectors alone: what one member's reports make
// them conclude, without a health manager, a clock or a stream.
#include "server/health_detectors.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

v1::CollectiveFingerprint Fingerprint(int64_t sequence, int64_t count,
                                      int bucket = 0) {
  v1::CollectiveFingerprint f;
  f.set_sequence(sequence);
  f.set_op("allreduce");
  f.set_dtype("float32");
  f.set_count(count);
  f.set_bucket_index(bucket);
  return f;
}

TEST(DesyncDetectorTest, SameCollectivesGiveNoVerdict) {
  DesyncDetector detector;
  for (int64_t seq = 1; seq <= 50; ++seq) {
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(detector.Observe(rank, Fingerprint(seq, 100 + seq)),
                std::nullopt);
    }
  }
}

TEST(DesyncDetectorTest, TheFirstDifferenceIsTheVerdictOnce) {
  DesyncDetector detector;
  EXPECT_EQ(detector.Observe(0, Fingerprint(7, 10, 2)), std::nullopt);
  EXPECT_EQ(detector.Observe(0, Fingerprint(7, 10, 2)), std::nullopt)
      << "a rank never disagrees with itself";
  std::optional<std::string> verdict = detector.Observe(1, Fingerprint(7, 12, 2));
  ASSERT_TRUE(verdict.has_value());
  EXPECT_THAT(*verdict,
              HasSubstr("collectives desynchronized at #7: rank 0 issued "
                        "allreduce of 10 float32 (bucket 2) but rank 1 issued "
                        "allreduce of 12 float32 (bucket 2)"));
  EXPECT_EQ(detector.Observe(2, Fingerprint(7, 99, 2)), std::nullopt)
      << "one verdict only";
}

TEST(DesyncDetectorTest, OldAndInvalidSequencesAreIgnored) {
  DesyncDetector detector;
  const int64_t newer = 5 + DesyncDetector::kWindow;
  EXPECT_EQ(detector.Observe(0, Fingerprint(newer, 10)), std::nullopt);
  // Sequence 5 shares the slot but is older than what it holds.
  EXPECT_EQ(detector.Observe(1, Fingerprint(5, 99)), std::nullopt);
  EXPECT_EQ(detector.Observe(1, Fingerprint(0, 99)), std::nullopt);
  EXPECT_EQ(detector.Observe(1, Fingerprint(-3, 99)), std::nullopt);
  EXPECT_TRUE(detector.Observe(1, Fingerprint(newer, 11)).has_value());
}

v1::StepReady Ready(int64_t step, absl::Time at) {
  v1::StepReady r;
  r.set_step(step);
  *r.mutable_time() = ToProtoTime(at);
  return r;
}

// Rank 2 is 300 ms late to every step of a 3-rank round: it is flagged
// once it has kMinLagSamples steps, not before; the others never are.
TEST(StragglerDetectorTest, AConsistentlyLateRankIsFlaggedAfterEnoughSteps) {
  StragglerDetector detector(3, absl::Milliseconds(100));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int step = 0; step < 8; ++step) {
    const absl::Time start = t0 + absl::Seconds(step);
    EXPECT_EQ(detector.Observe(0, Ready(step, start)), std::nullopt);
    EXPECT_EQ(detector.Observe(1, Ready(step, start + absl::Milliseconds(10))),
              std::nullopt);
    std::optional<std::vector<v1::Straggler>> after =
        detector.Observe(2, Ready(step, start + absl::Milliseconds(300)));
    ASSERT_TRUE(after.has_value()) << "rank 2 completes step " << step;
    if (step + 1 < StragglerDetector::kMinLagSamples) {
      EXPECT_TRUE(after->empty()) << step;
      continue;
    }
    ASSERT_EQ(after->size(), 1u) << step;
    EXPECT_EQ((*after)[0].rank(), 2);
    EXPECT_EQ(FromProtoDuration((*after)[0].lag()), absl::Milliseconds(300));
    EXPECT_EQ((*after)[0].steps(),
              std::min(step + 1, StragglerDetector::kLagSamples));
  }
  EXPECT_EQ(detector.lag(0), absl::ZeroDuration());
  EXPECT_EQ(detector.lag(1), absl::Milliseconds(10));
  EXPECT_EQ(detector.lag(2), absl::Milliseconds(300));
}

// The lag is a median: one slow step does not make a straggler, and a
// report repeated, out of range or too old for the window changes nothing.
TEST(StragglerDetectorTest, OneSlowStepAndBadReportsFlagNobody) {
  StragglerDetector detector(2, absl::Milliseconds(100));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int step = 0; step < 8; ++step) {
    const absl::Duration late =
        step == 3 ? absl::Seconds(2) : absl::Milliseconds(5);
    const absl::Time start = t0 + absl::Seconds(step);
    EXPECT_EQ(detector.Observe(0, Ready(step, start)), std::nullopt);
    EXPECT_EQ(detector.Observe(0, Ready(step, start)), std::nullopt)
        << "a repeated report";
    EXPECT_EQ(detector.Observe(5, Ready(step, start)), std::nullopt)
        << "no such rank";
    std::optional<std::vector<v1::Straggler>> after =
        detector.Observe(1, Ready(step, start + late));
    ASSERT_TRUE(after.has_value());
    EXPECT_TRUE(after->empty()) << step;
  }
  EXPECT_EQ(detector.lag(1), absl::Milliseconds(5));
  // A step the window has moved past (its slot holds a newer step):
  // ignored; the newer step still completes.
  const int64_t newer = 4 + StragglerDetector::kStepWindow;
  EXPECT_EQ(detector.Observe(0, Ready(newer, t0)), std::nullopt);
  EXPECT_EQ(detector.Observe(1, Ready(4, t0)), std::nullopt);
  EXPECT_TRUE(detector.Observe(1, Ready(newer, t0)).has_value());
  EXPECT_EQ(detector.Observe(0, Ready(-1, t0)), std::nullopt);
}

}  // namespace
}  // namespace gradsync
