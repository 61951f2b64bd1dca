// SIGTERM always stops gradsync-coordinator, cleanly and in bounded time,
// whatever is in flight: heartbeat streams, a join waiting for its round, a
// key-value wait, a job watch and the metrics endpoint, with the signal
// arriving while that load is still being set up or once it is all open.
#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/health.pb.h"
#include "proto/gradsync/v1/job.pb.h"
#include "tests/testing/subprocess.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {
namespace {

using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::Runfile;

// CoordinatorProcess starts the coordinator with --shutdown_grace=500ms;
// gradsync-coordinator gives up on a shutdown 3 s after the grace period
// (exit code 2), so a clean exit (code 0) within this bound means the
// shutdown completed by itself.
constexpr absl::Duration kStopBound = absl::Seconds(10);
constexpr int kRounds = 24;
constexpr int kIdleStreams = 64;

// Joins wait for the coordinator to be reachable (wait_for_ready), so a join
// sent after it stopped waits this long.
constexpr absl::Duration kJoinBound = absl::Seconds(5);

// Calls that stay open until the coordinator goes away, each on its own
// thread (or, for heartbeats, held by gRPC). Every call runs with one attempt
// and a bounded wait, so the threads end once the coordinator has stopped.
class OpenCalls {
 public:
  explicit OpenCalls(const std::string& address) {
    ClientOptions options;
    options.target = address;
    options.retry.max_attempts = 1;
    client_ = *CoordinatorClient::Create(options);
    setup_ = std::thread([this] { SetUp(); });
  }

  ~OpenCalls() {
    setup_.join();
    for (std::thread& t : waiting_) t.join();
  }

  // Whether every call was open before the coordinator stopped.
  bool WaitUntilOpen(absl::Duration bound) {
    return all_open_.WaitForNotificationWithTimeout(bound);
  }

 private:
  static v1::JoinRequest JoinRequest(const std::string& job, int min_nodes,
                                     int node) {
    v1::JoinRequest request;
    request.set_job_id(job);
    request.mutable_config()->set_job_id(job);
    request.mutable_config()->set_min_nodes(min_nodes);
    *request.mutable_config()->mutable_last_call_timeout() =
        ToProtoDuration(absl::ZeroDuration());
    *request.mutable_node() = LocalNodeDescriptor();
    request.mutable_node()->set_node_id(absl::StrCat("node-", node));
    return request;
  }

  // Forms a 2-member round, opens a heartbeat stream per member, then
  // leaves a join, a key wait and a watch waiting. Stops at the first
  // failure: the coordinator may already be shutting down.
  void SetUp() {
    std::vector<v1::JoinRequest> requests = {JoinRequest("train", 2, 0),
                                             JoinRequest("train", 2, 1)};
    std::vector<absl::StatusOr<v1::Assignment>> joined(
        2, absl::UnknownError("not joined"));
    std::thread second(
        [&] { joined[1] = client_->Join(requests[1], kJoinBound); });
    joined[0] = client_->Join(requests[0], kJoinBound);
    second.join();
    if (!joined[0].ok() || !joined[1].ok()) return;
    for (int i = 0; i < 2; ++i) {
      streams_.push_back(client_->OpenHeartbeatStream(
          [](const v1::HeartbeatResponse&) {}));
      v1::HeartbeatRequest beat;
      beat.mutable_member()->set_job_id("train");
      beat.mutable_member()->set_round(joined[i]->round());
      beat.mutable_member()->set_rank(joined[i]->rank());
      beat.mutable_member()->set_incarnation_id(
          requests[i].node().incarnation_id());
      if (!streams_.back()->Send(beat)) return;
    }
    // Streams that sent nothing yet: the coordinator holds a read open on
    // each, which fails when shutdown cancels it, and the stream answers
    // with a Finish on its completion queue: many of those race the queues'
    // own shutdown.
    for (int i = 0; i < kIdleStreams; ++i) {
      streams_.push_back(client_->OpenHeartbeatStream(
          [](const v1::HeartbeatResponse&) {}));
    }
    v1::Scope scope;
    scope.set_job_id("train");
    scope.set_round(joined[0]->round());
    waiting_.emplace_back([this] {
      (void)client_->Join(JoinRequest("waits-for-a-second-node", 2, 0),
                          kJoinBound);
    });
    waiting_.emplace_back([this, scope] {
      (void)client_->Wait(scope, {"never-set"}, absl::Seconds(30));
    });
    waiting_.emplace_back([this] {
      (void)client_->WatchJob("train", absl::Milliseconds(100), false,
                              [this](const v1::JobStatus&) {
                                if (!watching_.HasBeenNotified()) {
                                  watching_.Notify();
                                }
                                return true;
                              });
      if (!watching_.HasBeenNotified()) watching_.Notify();
    });
    watching_.WaitForNotification();  // the watch's first status arrived
    all_open_.Notify();
  }

  std::unique_ptr<CoordinatorClient> client_;
  std::vector<std::unique_ptr<HeartbeatStream>> streams_;
  std::vector<std::thread> waiting_;
  // Notified by the watch's first status (or its end); a member, since the
  // watch thread outlives SetUp().
  absl::Notification watching_;
  absl::Notification all_open_;
  std::thread setup_;
};

TEST(ShutdownProcessTest, SigtermEndsTheCoordinatorWhateverIsInFlight) {
  int rounds_with_all_open = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    CoordinatorProcess coordinator;
    ASSERT_TRUE(coordinator.Start(Runfile("server/gradsync-coordinator"),
                                  absl::StrCat("shutdown-", round),
                                  {"--metrics_listen=127.0.0.1:0"}));
    OpenCalls calls(coordinator.address());
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
