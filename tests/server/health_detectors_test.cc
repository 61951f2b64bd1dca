// The desync, straggler and divergence detectors alone: what one member's reports make
// them conclude, without a health manager, a clock or a stream.
#include "server/health_detectors.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

v1::ReplicaFingerprint Replica(int64_t step, std::vector<uint64_t> tensors,
                               bool named = false) {
  v1::ReplicaFingerprint f;
  f.set_step(step);
  for (uint64_t t : tensors) f.add_tensors(t);
  if (named) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      f.add_tensor_names(absl::StrCat("layer", i, ".weight"));
    }
  }
  return f;
}

TEST(DivergenceDetectorTest, AgreeingReplicasAreVerifiedOnceEveryRankReported) {
  DivergenceDetector detector(3);
  EXPECT_FALSE(detector.Observe(0, Replica(100, {1, 2}, true)).has_value());
  EXPECT_FALSE(detector.Observe(2, Replica(100, {1, 2})).has_value());
  EXPECT_FALSE(detector.Observe(2, Replica(100, {1, 2})).has_value());  // repeat
  std::optional<DivergenceDetector::Outcome> outcome =
      detector.Observe(1, Replica(100, {1, 2}));
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->step, 100);
  EXPECT_FALSE(outcome->divergence.has_value());
}

// (world size, diverged ranks): the minority is named with the tensor.
class DivergenceMinorityTest
    : public ::testing::TestWithParam<std::pair<int, std::vector<int>>> {};

TEST_P(DivergenceMinorityTest, TheMinorityIsNamedWithItsTensors) {
  const auto& [world, diverged] = GetParam();
  DivergenceDetector detector(world);
  std::optional<DivergenceDetector::Outcome> outcome;
  for (int r = 0; r < world; ++r) {
    const bool bad = std::find(diverged.begin(), diverged.end(), r) != diverged.end();
    outcome = detector.Observe(r, Replica(40, {7, bad ? 9u + r : 8u, 5}, r == 0));
  }
  ASSERT_TRUE(outcome.has_value());
  ASSERT_TRUE(outcome->divergence.has_value());
  EXPECT_TRUE(outcome->majority);
  const v1::Divergence& d = *outcome->divergence;
  EXPECT_EQ(d.step(), 40);
  EXPECT_EQ(std::vector<int>(d.ranks().begin(), d.ranks().end()), diverged);
  ASSERT_EQ(d.tensors_size(), 1);
  EXPECT_EQ(d.tensors(0), "layer1.weight");
  EXPECT_THAT(d.verdict(), HasSubstr("replicas diverged at step 40"));
  EXPECT_THAT(d.verdict(), HasSubstr("(the majority) in layer1.weight"));
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, DivergenceMinorityTest,
    ::testing::Values(std::make_pair(3, std::vector<int>{2}),
                      std::make_pair(3, std::vector<int>{0}),
                      std::make_pair(5, std::vector<int>{1, 3}),
                      std::make_pair(8, std::vector<int>{7})));

TEST(DivergenceDetectorTest, WithoutAMajorityEveryRankIsNamed) {
  DivergenceDetector detector(2);
  EXPECT_FALSE(detector.Observe(0, Replica(10, {1, 2})).has_value());
  std::optional<DivergenceDetector::Outcome> outcome =
      detector.Observe(1, Replica(10, {1, 3}));
  ASSERT_TRUE(outcome.has_value() && outcome->divergence.has_value());
  EXPECT_FALSE(outcome->majority);
  EXPECT_EQ(outcome->divergence->ranks_size(), 2);
  EXPECT_EQ(outcome->divergence->tensors(0), "tensor #1");  // never named
  EXPECT_THAT(outcome->divergence->verdict(), HasSubstr("with no majority"));
}

TEST(DivergenceDetectorTest, StepsAreMatchedWithinTheWindowOnly) {
  DivergenceDetector detector(2);
  // Rank 0 runs a window ahead: its step 1 is dropped, and rank 1's step 1
  // can no longer complete it.
  const int64_t later = 1 + DivergenceDetector::kStepWindow;
  for (int64_t step = 1; step <= later; ++step) {
    EXPECT_FALSE(detector.Observe(0, Replica(step, {1})).has_value());
  }
  EXPECT_FALSE(detector.Observe(1, Replica(1, {2})).has_value());
  std::optional<DivergenceDetector::Outcome> outcome =
      detector.Observe(1, Replica(later, {1}));
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->step, later);
  EXPECT_FALSE(outcome->divergence.has_value());
}

}  // namespace
}  // namespace gradsync
