// Calls left open against a coordinator, for the tests that stop it with
// everything in flight: a formed round with heartbeat streams (two that
// beat, many that never sent), a join waiting for its round, a key-value
// wait and a job watch.
#ifndef GRADSYNC_TESTS_TESTING_OPEN_CALLS_H_
#define GRADSYNC_TESTS_TESTING_OPEN_CALLS_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync::testing {

// Opens the calls on a thread of its own from construction on, so the
// coordinator may stop at any point of the setup. Every call runs with one
// attempt and a bounded wait, so the destructor (which joins the threads)
// returns once the coordinator has stopped: joins wait at most `join_bound`
// for it to be reachable (wait_for_ready), the key wait 30 s.
// Lifetime: destroy after the coordinator stopped. Thread-compatible.
class OpenCalls {
 public:
  OpenCalls(const std::string& address, absl::Duration join_bound,
            int idle_streams = 64);
  ~OpenCalls();
  OpenCalls(const OpenCalls&) = delete;
  OpenCalls& operator=(const OpenCalls&) = delete;

  // Waits (at most `bound`) until the setup ended; whether it opened every
  // call (it stops at the first failure).
  bool WaitUntilOpen(absl::Duration bound);

 private:
  // Forms a 2-member round, opens a heartbeat stream per member and the
  // idle streams, then leaves a join, a key wait and a watch waiting.
  // Stops at the first failure: the coordinator may already be stopping.
  void SetUp();

  const absl::Duration join_bound_;
  const int idle_streams_;
  std::unique_ptr<CoordinatorClient> client_;
  std::vector<std::unique_ptr<HeartbeatStream>> streams_;
  std::vector<std::thread> waiting_;
  // Notified by the watch's first status (or its end); a member, since the
  // watch thread outlives SetUp().
  absl::Notification watching_;
  absl::Notification all_open_;
  absl::Notification setup_ended_;
  std::thread setup_;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_OPEN_CALLS_H_
