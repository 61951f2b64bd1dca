#include "server/queue_delays.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/time/time.h"

namespace gradsync {
namespace {

TEST(QueueDelaysTest, EachQueueReadsItsOwnDelay) {
  QueueDelays delays(3);
  const std::vector<absl::Duration> per_queue = {
      absl::Milliseconds(5), absl::Milliseconds(700), absl::ZeroDuration()};
  delays.Report(absl::Milliseconds(700), per_queue);
  EXPECT_EQ(delays.overall(), absl::Milliseconds(700));
  EXPECT_EQ(delays.Of(0), absl::Milliseconds(5));
  EXPECT_EQ(delays.Of(1), absl::Milliseconds(700));
  EXPECT_EQ(delays.Of(2), absl::ZeroDuration());
}

TEST(QueueDelaysTest, NothingReportedIsZero) {
  QueueDelays delays(2);
  EXPECT_EQ(delays.overall(), absl::ZeroDuration());
  EXPECT_EQ(delays.Of(0), absl::ZeroDuration());
  EXPECT_EQ(delays.Of(5), absl::ZeroDuration());
}

TEST(QueueDelaysTest, AnUnknownQueueReadsTheLargest) {
  QueueDelays delays(2);
  const std::vector<absl::Duration> per_queue = {absl::Milliseconds(1),
                                                 absl::Milliseconds(2)};
  delays.Report(absl::Milliseconds(9), per_queue);
  EXPECT_EQ(delays.Of(-1), absl::Milliseconds(9)) << "a session of no queue";
  EXPECT_EQ(delays.Of(2), absl::Milliseconds(9)) << "beyond the count";
}

TEST(QueueDelaysTest, QueuesNotReportedReadTheLargest) {
  QueueDelays delays(3);
  const std::vector<absl::Duration> first = {absl::Milliseconds(1)};
  delays.Report(absl::Milliseconds(4), first);
  EXPECT_EQ(delays.Of(0), absl::Milliseconds(1));
  EXPECT_EQ(delays.Of(1), absl::Milliseconds(4));
  EXPECT_EQ(delays.Of(2), absl::Milliseconds(4));
  delays.Report(absl::Milliseconds(6));  // only the largest, this time
  EXPECT_EQ(delays.Of(0), absl::Milliseconds(6)) << "no stale figure stays";
}

TEST(QueueDelaysTest, WithoutQueuesOnlyTheLargestIsKept) {
  QueueDelays delays(0);
  const std::vector<absl::Duration> per_queue = {absl::Milliseconds(1)};
  delays.Report(absl::Milliseconds(3), per_queue);
  EXPECT_EQ(delays.Of(0), absl::Milliseconds(3));
}

}  // namespace
}  // namespace gradsync
