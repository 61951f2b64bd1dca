// CreateProcessGroup's shared-memory bootstrap on a fake coordinator: a
// rank waiting for a peer that never attaches (a process that died first)
// stops when its cancel flag is set, as the runtime sets it once the
// coordinator ended the round, instead of waiting out the timeout.
#include "worker/runtime/process_group.h"

#include <atomic>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

v1::Assignment OneNodeRound(int rank, int world_size) {
  v1::Assignment assignment;
  assignment.set_job_id("pg-job");
  assignment.set_round(1);
  assignment.set_rank(rank);
  assignment.set_world_size(world_size);
  assignment.set_num_nodes(1);
  assignment.set_backend(v1::BACKEND_GLOO);
  return assignment;
}

TEST(ProcessGroupTest, ASharedMemoryBootstrapStopsWaitingOnceCancelled) {
  FakeCoordinatorClient fake;
  std::atomic<bool> cancel{false};
  ProcessGroupOptions options;
  options.timeout = absl::Seconds(120);  // far beyond the test's bound
  options.cancel = &cancel;
  std::thread canceller([&cancel] {
    absl::SleepFor(absl::Milliseconds(200));
    cancel.store(true);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Backend>> group =
      CreateProcessGroup(&fake, OneNodeRound(0, 2), options);
  const absl::Duration took = absl::Now() - start;
  canceller.join();
  EXPECT_TRUE(absl::IsCancelled(group.status())) << group.status();
  EXPECT_THAT(group.status().message(), HasSubstr("cancelled"));
  EXPECT_LT(took, absl::Seconds(60));
}

TEST(ProcessGroupTest, ASharedMemoryRoundOfOneNeedsNoCancel) {
  FakeCoordinatorClient fake;
  absl::StatusOr<std::unique_ptr<Backend>> group =
      CreateProcessGroup(&fake, OneNodeRound(0, 1), ProcessGroupOptions());
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->name(), "shm");
}

}  // namespace
}  // namespace gradsync
