// SIGTERM always stops gradsync-coordinator, cleanly and in bounded time,
// whatever is in flight: heartbeat streams, a join waiting for its round, a
// key-value wait, a job watch and the metrics endpoint, with the signal
// arriving while that load is still being set up or once it is all open
// (tests/testing/open_calls.h).
#include <signal.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/open_calls.h"
#include "tests/testing/subprocess.h"

namespace gradsync {
namespace {

using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::OpenCalls;
using ::gradsync::testing::Runfile;

// CoordinatorProcess starts the coordinator with --shutdown_grace=500ms;
// gradsync-coordinator gives up on a shutdown 3 s after the grace period
// (exit code 2), so a clean exit (code 0) within this bound means the
// shutdown completed by itself.
constexpr absl::Duration kStopBound = absl::Seconds(10);
// The shutdown's races are stressed in process (shutdown_stress_test, 200
// stops); here, the signal's path.
constexpr int kRounds = 12;

// Joins wait for the coordinator to be reachable (wait_for_ready), so a join
// sent after it stopped waits this long.
constexpr absl::Duration kJoinBound = absl::Seconds(5);

TEST(ShutdownProcessTest, SigtermEndsTheCoordinatorWhateverIsInFlight) {
  int rounds_with_all_open = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    CoordinatorProcess coordinator;
    ASSERT_TRUE(coordinator.Start(Runfile("server/gradsync-coordinator"),
                                  absl::StrCat("shutdown-", round),
                                  {"--metrics_listen=127.0.0.1:0"}));
    OpenCalls calls(coordinator.address(), kJoinBound);
    // Every other round, the signal comes while the calls are still being
    // opened (at a different point each time); otherwise once all are open.
    if (round % 2 == 0) {
      absl::SleepFor(absl::Milliseconds(10 * (round % 8)));
    } else if (calls.WaitUntilOpen(absl::Seconds(30))) {
      ++rounds_with_all_open;
    }
    ASSERT_TRUE(coordinator.Stop(kStopBound));
  }
  EXPECT_EQ(rounds_with_all_open, kRounds / 2);
}

}  // namespace
}  // namespace gradsync
