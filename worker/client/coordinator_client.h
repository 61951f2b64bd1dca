// The coordinator as its clients see it: the calls a worker, the node agent
// and the CLI make (join, key-value store, jobs, heartbeat streams), as an
// interface. GrpcCoordinatorClient (grpc_coordinator_client.h) is the real
// one, over gRPC with retries and leader routing; tests use
// FakeCoordinatorClient (tests/testing/fake_coordinator_client.h).
//
// Errors carry the coordinator's codes and messages (see rendezvous.proto,
// kv.proto, jobs.proto, health.proto). Implementations are thread-safe: many
// threads may call at once.
#ifndef GRADSYNC_WORKER_CLIENT_COORDINATOR_CLIENT_H_
#define GRADSYNC_WORKER_CLIENT_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/health.pb.h"
#include "proto/gradsync/v1/jobs.pb.h"
#include "proto/gradsync/v1/kv.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"

namespace gradsync {

// One heartbeat stream, of a member or of a node. Send() never blocks: a
// message waiting behind one in flight takes in the newer one (a member's
// newer heartbeat replaces its older one). Thread-safe. The destructor
// cancels a stream that was not closed and waits for the transport to let go
// of it.
template <typename Request>
class OutgoingStream {
 public:
  virtual ~OutgoingStream() = default;
  // Queues `request`; false once the stream has ended.
  virtual bool Send(Request request) = 0;
  // The final status once the stream has ended; nullopt while it is open.
  virtual std::optional<absl::Status> ended() const = 0;
  // Half-closes the stream after the heartbeat in flight and waits up to
  // `timeout` for the coordinator's status (DEADLINE_EXCEEDED after it).
  virtual absl::Status Close(absl::Duration timeout) = 0;
};
// One member's heartbeats (Monitor.Heartbeat), or a node's (NodeHeartbeat).
using HeartbeatStream = OutgoingStream<v1::HeartbeatRequest>;
using NodeHeartbeatStream = OutgoingStream<v1::NodeHeartbeatRequest>;

// A connection to the coordinator. See the file comment.
class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  // Joins a job and blocks until its round closes. Waits at most `max_wait`
  // (default: the join timeout of `request.config()`, or 10 minutes, plus a
  // margin so that the coordinator's own timeout error arrives first).
  virtual absl::StatusOr<v1::Assignment> Join(
      const v1::JoinRequest& request,
      absl::Duration max_wait = absl::ZeroDuration()) = 0;
  // Joins every process of one node in one call (see rendezvous.proto);
  // their assignments in the order of the request. `max_wait` as for Join.
  virtual absl::StatusOr<std::vector<v1::Assignment>> JoinNode(
      const v1::JoinNodeRequest& request,
      absl::Duration max_wait = absl::ZeroDuration()) = 0;
  // Leaves a job; a join of `incarnation_id` in progress ends CANCELLED.
  virtual absl::Status Leave(const std::string& job_id,
                             const std::string& incarnation_id) = 0;

  // Key-value store of one job round (see kv.proto).
  virtual absl::Status Set(const v1::Scope& scope, const std::string& key,
                           const std::string& value) = 0;
  virtual absl::StatusOr<std::string> Get(const v1::Scope& scope,
                                          const std::string& key) = 0;
  // Add and CompareAndSet (without a request_id of the caller's) send a
  // fresh request id, the same with every attempt of the call, so that a
  // retry after a lost answer does not apply twice (kv.proto).
  virtual absl::StatusOr<int64_t> Add(const v1::Scope& scope,
                                      const std::string& key,
                                      int64_t delta) = 0;
  virtual absl::StatusOr<v1::CompareAndSetResponse> CompareAndSet(
      const v1::CompareAndSetRequest& request) = 0;
  // Blocks until every key exists or `timeout` passes (DEADLINE_EXCEEDED).
  virtual absl::Status Wait(const v1::Scope& scope,
                            const std::vector<std::string>& keys,
                            absl::Duration timeout) = 0;
  virtual absl::StatusOr<bool> Delete(const v1::Scope& scope,
                                      const std::string& key) = 0;
  virtual absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
  List(const v1::Scope& scope, const std::string& prefix, bool keys_only) = 0;

  // Jobs.
  // The created job and, from a coordinator with --auth=token (the admin's
  // token only), the job's token.
  virtual absl::StatusOr<v1::CreateJobResponse> CreateJob(
      const v1::JobConfig& config) = 0;
  // Admin only (Tokens service): a new token for job `job_id`, replacing its
  // old one; and the revocation of its token.
  virtual absl::StatusOr<std::string> RotateToken(const std::string& job_id) = 0;
  virtual absl::Status RevokeToken(const std::string& job_id) = 0;
  // With `with_buckets`, members' metrics include their per-bucket stats.
  virtual absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id,
                                               bool with_buckets = false) = 0;
  // GetJob with everything the request can say (a member query, a page);
  // the whole answer, next_page_token included.
  virtual absl::StatusOr<v1::GetJobResponse> QueryJob(
      const v1::GetJobRequest& request) = 0;
  virtual absl::StatusOr<std::vector<v1::JobStatus>> ListJobs() = 0;

  // Streams `job_id`'s status (Jobs.WatchJob): calls `on_status` with each
  // update until the job ends (then returns OK), the stream fails, or
  // `on_status` returns false (then returns CANCELLED). Blocks; no deadline.
  virtual absl::Status WatchJob(
      const std::string& job_id, absl::Duration min_interval,
      bool with_buckets,
      const std::function<bool(const v1::JobStatus&)>& on_status,
      const v1::MemberQuery& members = v1::MemberQuery()) = 0;

  // Monitor. Opens a heartbeat stream without waiting for the connection: a
  // coordinator that is down ends the stream with UNAVAILABLE at once.
  // `on_response` runs on a transport thread for every answer.
  virtual std::unique_ptr<HeartbeatStream> OpenHeartbeatStream(
      std::function<void(const v1::HeartbeatResponse&)> on_response) = 0;
  // The same for a node's members together (Monitor.NodeHeartbeat; see
  // NodeHeartbeats in worker/runtime/node_heartbeats.h).
  virtual std::unique_ptr<NodeHeartbeatStream> OpenNodeHeartbeatStream(
      std::function<void(const v1::NodeHeartbeatResponse&)> on_response) = 0;
  // Reports a member's completion (idempotent, so retried); returns the
  // job's state after it.
  virtual absl::StatusOr<v1::JobState> ReportCompletion(
      const v1::ReportCompletionRequest& request) = 0;

  // Where the calls go ("HOST:PORT", or the replicas' list), for messages.
  virtual std::string target() const = 0;
};

// Applies one message of a WatchJob stream to `job`, the status built from
// the messages before it (see WatchJobResponse): `job` becomes the job's
// whole status as of that message.
void ApplyWatchResponse(v1::WatchJobResponse response, v1::JobStatus* job);

// A random 128-bit id in hex (32 characters), for
// NodeDescriptor.incarnation_id and the request ids of key-value calls.
std::string NewRandomId();

// This process's descriptor: hostname, pid, a fresh incarnation id, CPU
// device. Callers adjust node_id, devices and addresses as needed.
v1::NodeDescriptor LocalNodeDescriptor();

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_CLIENT_COORDINATOR_CLIENT_H_
