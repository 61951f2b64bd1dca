// NodeHeartbeats: the heartbeats of the members a process hosts (a node
// agent's ranks) on one Monitor.NodeHeartbeat stream, batched per interval.
//
// Each member keeps its own HealthReporter, exactly as a process reporting
// alone does (verdicts, backoff, completion reports); only the transport is
// shared. The reporters open their streams here (Open(), through
// HealthReporterOptions::open_stream) instead of on the client: each gets a
// lane of the node's stream. A lane's heartbeat waits until every open lane
// has one (or `batch_window` passed), and they go out as one message, so a
// node of 8 ranks costs the coordinator one stream and one message per
// interval instead of 8.
//
// The interval is each reporter's, as the coordinator's answers for its
// member set it (the job's, or longer while the coordinator sheds load):
// the members of a node are told together, so their lanes slow down and
// speed up together and the batches follow.
//
// Lanes behave like the streams they replace: an error the coordinator
// answers for a member ends that lane only (ABORTED when its round is over,
// ...); when the node's stream ends (broken, coordinator down), every lane
// on it ends with its status, the reporters back off and open new lanes, and
// the first of them opens a new node stream. Closing a lane tells the
// coordinator the member left cleanly (as a half-closed stream does).
//
//   NodeHeartbeats heartbeats(client.get());
//   HealthReporterOptions options;
//   options.open_stream = heartbeats.Opener();
//   HealthReporter reporter(client.get(), options);  // one per rank
//
// Thread-safe. `client` must outlive it; it must outlive every lane (its
// reporters).
#ifndef GRADSYNC_WORKER_RUNTIME_NODE_HEARTBEATS_H_
#define GRADSYNC_WORKER_RUNTIME_NODE_HEARTBEATS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/health.pb.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {

class NodeHeartbeats {
 public:
  // What HealthReporterOptions::open_stream takes.
  using Opener = std::function<std::unique_ptr<HeartbeatStream>(
      std::function<void(const v1::HeartbeatResponse&)>)>;

  explicit NodeHeartbeats(CoordinatorClient* client,
                          absl::Duration batch_window = absl::Milliseconds(50));
  // Closes the node's stream and joins the sending thread.
  ~NodeHeartbeats();
  NodeHeartbeats(const NodeHeartbeats&) = delete;
  NodeHeartbeats& operator=(const NodeHeartbeats&) = delete;

  // A member's heartbeat stream on the node's stream; `on_response` gets
  // the coordinator's answers for that member.
  std::unique_ptr<HeartbeatStream> Open(
      std::function<void(const v1::HeartbeatResponse&)> on_response);
  // Open() as a function, for HealthReporterOptions::open_stream.
  Opener opener() {
    return [this](std::function<void(const v1::HeartbeatResponse&)> f) {
      return Open(std::move(f));
    };
  }

  // Messages sent on node streams so far, and node streams opened.
  int64_t batches_sent() const;
  int64_t streams_opened() const;

  // How long the last heartbeats of a closing lane may take to be sent.
  static constexpr absl::Duration kCloseTimeout = absl::Seconds(5);

 private:
  class Lane;
  // A lane's state, kept by the node while the lane is open.
  struct LaneState {
    std::function<void(const v1::HeartbeatResponse&)> on_response;
    std::shared_ptr<NodeHeartbeatStream> stream;  // the one it was opened on
    int64_t generation = 0;                       // of that stream
    std::optional<v1::HeartbeatRequest> pending;  // not sent yet
    std::optional<v1::MemberRef> member;          // of its last heartbeat
    std::optional<absl::Status> ended;            // answered with an error
  };

  // The sending thread: batches the lanes' pending heartbeats.
  void Run();
  // Whether every open lane of the current stream has a heartbeat waiting.
  bool AllPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Routes the answers of node stream `generation` to their lanes.
  void OnAnswers(int64_t generation, const v1::NodeHeartbeatResponse& response);
  // What the lanes' HeartbeatStream methods do.
  bool LaneSend(LaneState* lane, v1::HeartbeatRequest request);
  std::optional<absl::Status> LaneEnded(const LaneState* lane) const;
  std::optional<absl::Status> LaneEndedLocked(const LaneState* lane) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseLane(LaneState* lane);
  // The current node stream, opened when there is none or it ended.
  std::pair<std::shared_ptr<NodeHeartbeatStream>, int64_t> CurrentStream();

  CoordinatorClient* const client_;
  const absl::Duration batch_window_;

  mutable absl::Mutex mu_;
  std::shared_ptr<NodeHeartbeatStream> stream_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // of stream_
  std::vector<LaneState*> lanes_ ABSL_GUARDED_BY(mu_);
  // For the next batch: the last heartbeats of lanes closed since, and
  // their members.
  std::vector<v1::HeartbeatRequest> last_heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::MemberRef> closed_ ABSL_GUARDED_BY(mu_);
  // When the oldest heartbeat still waiting was queued.
  std::optional<absl::Time> first_pending_ ABSL_GUARDED_BY(mu_);
  // Answer callbacks running without the lock; a closing lane waits for 0.
  int dispatching_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t batches_sent_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_NODE_HEARTBEATS_H_
