// ObservedBackend over a scripted backend whose collectives complete when
// the test says so.
#include "worker/backend/observed_backend.h"

#include <memory>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/scripted_backend.h"

namespace gradsync {
namespace {

using ::gradsync::testing::ScriptedBackend;

TEST(ObservedBackendTest, RecordsFingerprintsInIssueOrder) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  float data[7] = {};
  double wide[3] = {};
  observed.AllReduce(Buffer{data, 7, DataType::kFloat32}, ReduceOp::kAverage);
  observed.Broadcast(Buffer{wide, 3, DataType::kFloat64}, 0);
  observed.Barrier();
  observed.AllReduce(Buffer{nullptr, 5, DataType::kFloat32}, ReduceOp::kSum);

  std::vector<CollectiveRecord> records = observed.TakeRecords();
  ASSERT_EQ(records.size(), 3u);  // the refused one is not recorded
  EXPECT_EQ(records[0].sequence, 1u);
  EXPECT_EQ(records[0].op, "allreduce");
  EXPECT_EQ(records[0].dtype, DataType::kFloat32);
  EXPECT_EQ(records[0].count, 7);
  EXPECT_EQ(records[1].op, "broadcast");
  EXPECT_EQ(records[1].dtype, DataType::kFloat64);
  EXPECT_EQ(records[2].op, "barrier");
  EXPECT_EQ(records[2].count, 0);
  EXPECT_TRUE(observed.TakeRecords().empty());
  EXPECT_EQ(observed.name(), "scripted");
}

TEST(ObservedBackendTest, LastFinishedWaitsForEveryEarlierCollective) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  EXPECT_EQ(observed.last_started(), 0u);
  EXPECT_EQ(observed.last_finished(), 0u);
  for (int i = 0; i < 3; ++i) observed.Barrier();
  EXPECT_EQ(observed.last_started(), 3u);
  inner.works[1]->Finish(absl::OkStatus());  // #2 before #1
  EXPECT_EQ(observed.last_finished(), 0u);
  inner.works[0]->Finish(absl::OkStatus());
  EXPECT_EQ(observed.last_finished(), 2u);
  inner.works[2]->Finish(absl::UnavailableError("peer died"));
  EXPECT_EQ(observed.last_finished(), 3u);  // ended, if badly
}

TEST(ObservedBackendTest, AbortReachesTheInnerBackend) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  observed.Abort();
  EXPECT_EQ(inner.aborts, 1);
}

TEST(ObservedBackendTest, KeepsOnlyTheNewestRecords) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  for (size_t i = 0; i < ObservedBackend::kMaxPending + 5; ++i) {
    observed.Barrier();
  }
  std::vector<CollectiveRecord> records = observed.TakeRecords();
  ASSERT_EQ(records.size(), ObservedBackend::kMaxPending);
  EXPECT_EQ(records.front().sequence, 6u);
}

TEST(ObservedBackendTest, KnowsSinceWhenTheOldestCollectiveIsInFlight) {
  ScriptedBackend inner;
  FakeClock clock;
  ObservedBackend observed(&inner, &clock);
  EXPECT_FALSE(observed.oldest_in_flight().has_value());
  const absl::Time first = clock.Now();
  observed.Barrier();
  clock.Advance(absl::Seconds(2));
  observed.Barrier();
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(observed.oldest_in_flight().has_value());
  EXPECT_EQ(observed.oldest_in_flight()->sequence, 1u);
  EXPECT_EQ(observed.oldest_in_flight()->issued, first);
  inner.works[0]->Finish(absl::OkStatus());
  ASSERT_TRUE(observed.oldest_in_flight().has_value());
  EXPECT_EQ(observed.oldest_in_flight()->sequence, 2u);
  EXPECT_EQ(observed.oldest_in_flight()->issued, first + absl::Seconds(2));
  inner.works[1]->Finish(absl::AbortedError("aborted"));
  EXPECT_FALSE(observed.oldest_in_flight().has_value());
  EXPECT_EQ(observed.last_finished(), 2u);
}

}  // namespace
}  // namespace gradsync
