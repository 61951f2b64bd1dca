// Coordinator::Shutdown() ends, without a crash or a hang, 200 times in a
// row, whatever is in flight: a formed round with heartbeat streams (16 of
// them idle), a join waiting for its round, a key-value wait, a job watch
// (tests/testing/open_calls.h), and a client sending calls as fast as it
// can. Half the stops come while those calls are still being opened, at a
// different point each time; the other half once all are open. Each stop
// races gRPC's own events: accepted calls still queued, writes completing
// as the watch is cancelled, reads failing as streams are cancelled.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/health.pb.h"
#include "proto/gradsync/v1/job.pb.h"
#include "server/coordinator.h"
#include "tests/testing/open_calls.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::gradsync::testing::OpenCalls;

constexpr int kStops = 200;
// In process, the grace is short: it bounds each stop with streams open.
constexpr absl::Duration kGrace = absl::Milliseconds(50);
// A stop that takes this long hangs: the test aborts with the round named
// (a hang would otherwise end only at the test runner's timeout).
constexpr absl::Duration kHangBound = absl::Seconds(60);
// A join sent after the stop waits this long for the coordinator (the
// round's joins, sent while it runs, take milliseconds).
constexpr absl::Duration kJoinBound = absl::Milliseconds(250);

// Sends calls as fast as it can until destroyed: a status read, a key
// write, and a heartbeat stream opened, used once and closed (the
// asynchronous API's accepted calls race the queues' shutdown). Each call
// has one attempt and a short deadline, and none waits for the coordinator
// to be reachable, so the load ends at once after the stop.
class Load {
 public:
  explicit Load(const std::string& address) {
    ClientOptions options;
    options.target = address;
    options.call_timeout = absl::Milliseconds(500);
    options.retry.max_attempts = 1;
    client_ = *GrpcCoordinatorClient::Create(options);
    thread_ = std::thread([this] { Run(); });
  }
  ~Load() {
    stop_.Notify();
    thread_.join();
  }

 private:
  void Run() {
    v1::Scope scope;
    scope.set_job_id("train");
    scope.set_round(1);
    v1::HeartbeatRequest beat;
    beat.mutable_member()->set_job_id("train");
    beat.mutable_member()->set_round(1);
    for (int i = 0; !stop_.HasBeenNotified(); ++i) {
      (void)client_->GetJob("train");
      (void)client_->Set(scope, absl::StrCat("key-", i), "value");
      std::unique_ptr<HeartbeatStream> stream =
          client_->OpenHeartbeatStream([](const v1::HeartbeatResponse&) {});
      (void)stream->Send(beat);
    }
  }

  std::unique_ptr<CoordinatorClient> client_;
  absl::Notification stop_;
  std::thread thread_;
};

// Aborts the process when a stop outlives kHangBound.
class HangWatch {
 public:
  explicit HangWatch(int round)
      : thread_([this, round] {
          if (!done_.WaitForNotificationWithTimeout(kHangBound)) {
            std::fprintf(stderr, "stop %d did not end within %s: a hang\n",
                         round, absl::FormatDuration(kHangBound).c_str());
            std::abort();
          }
        }) {}
  ~HangWatch() {
    done_.Notify();
    thread_.join();
  }

 private:
  absl::Notification done_;
  std::thread thread_;
};

TEST(ShutdownStressTest, TwoHundredStopsUnderLoadEndCleanly) {
  int stops_with_all_open = 0;
  for (int round = 0; round < kStops; ++round) {
    SCOPED_TRACE(absl::StrCat("stop ", round));
    CoordinatorConfig config;
    config.listen_address = "127.0.0.1:0";
    config.metrics_listen_address = "127.0.0.1:0";
    config.poll_interval = absl::Milliseconds(2);
    config.shutdown_grace = kGrace;
    config.completion_queues = 4;
    auto coordinator = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator->Start().ok());
    const std::string address = absl::StrCat("127.0.0.1:", coordinator->port());
    HangWatch watch(round);
    {
      OpenCalls calls(address, kJoinBound, /*idle_streams=*/16);
      Load load(address);
      if (round % 2 == 0) {
        absl::SleepFor(absl::Milliseconds(round % 20));
      } else if (calls.WaitUntilOpen(absl::Seconds(30))) {
        ++stops_with_all_open;
      }
      coordinator->Shutdown();
    }
    coordinator.reset();
  }
  // Stops after the setup had everything open (not all of them need to: a
  // loaded machine may miss the joins' bound now and then).
  EXPECT_GE(stops_with_all_open, kStops / 4);
}

}  // namespace
}  // namespace gradsync
