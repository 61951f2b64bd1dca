// GrpcCoordinatorClient: the CoordinatorClient (coordinator_client.h) that
// talks to a coordinator, or its replicas, over gRPC.
#ifndef GRADSYNC_WORKER_CLIENT_GRPC_COORDINATOR_CLIENT_H_
#define GRADSYNC_WORKER_CLIENT_GRPC_COORDINATOR_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/health.grpc.pb.h"
#include "common/channel_credentials.h"
#include "common/leader_term.h"
#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "proto/gradsync/v1/kv.grpc.pb.h"
#include "proto/gradsync/v1/rendezvous.grpc.pb.h"
#include "proto/gradsync/v1/tokens.grpc.pb.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {

// How UNAVAILABLE calls are retried. The defaults ride out a coordinator
// restart of up to a minute: a join, key-value call or completion report in
// flight when the coordinator went down is retried until it is answered.
struct RetryPolicy {
  // Attempts in all, the first included; 1 disables retries.
  int max_attempts = 1000;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  // Short, so that calls resume within about a second of a coordinator's
  // return: members still bootstrapping must heartbeat within its grace.
  absl::Duration max_backoff = absl::Seconds(1);
  double backoff_multiplier = 2.0;
  // Each backoff is scaled by a random factor in [1 - jitter, 1 + jitter].
  double jitter = 0.2;
  // No retry starts once this much time has passed since the first attempt.
  absl::Duration budget = absl::Seconds(60);
};

struct ClientOptions {
  // The coordinator, "HOST:PORT"; or its replicas (see
  // gradsync-coordinator --etcd), "HOST:PORT,HOST:PORT,..." (a name in a
  // list stands for its IPv4 addresses when the client is created, see
  // FailoverTarget): calls go to the first that accepts a connection; a replica
  // that stands by answers with the leader's address, and calls move there
  // until it goes away, then try the list again.
  std::string target;
  // Deadline of each attempt of a call that does not wait by design.
  absl::Duration call_timeout = absl::Seconds(10);
  // Transport security: TLS when tls.ca is set (MakeChannelCredentials).
  ClientTls tls;
  // Sent with every call as `authorization: Bearer TOKEN` when not empty
  // (a coordinator with --auth=token; see ClientToken()).
  std::string token;
  RetryPolicy retry;
  // Told, on the calling thread, of every answered call whose answer names
  // the leader's term (a replica under etcd leadership stamps key-value
  // answers: common/leader_term.h), with the call's name ("set", "get",
  // ...): fault tests attribute each acknowledgement to a term.
  std::function<void(const char* what, const TermStamp& stamp)> on_term;
};

// A connection to a coordinator that does not complete within this moves
// on to the next replica. With keepalive (common/keepalive.h) a client so
// leaves a frozen leader within about 10 s, inside the grace a new leader
// gives members to heartbeat again (HealthManager::kRestartGrace).
inline constexpr absl::Duration kConnectTimeout = absl::Seconds(4);

// One connection (channel) to a coordinator. Thread-safe: many threads may
// call at once.
// Calls go to the coordinator named in ClientOptions::target, or to the
// leader among its replicas. Every call has a deadline; calls that fail with
// UNAVAILABLE (coordinator not up yet, restarting, connection broken), and
// calls the coordinator's transport ended to free memory (gRPC's reclaimer
// under its --transport_memory_limit), are retried with exponential backoff
// and jitter within ClientOptions::retry's budget. Other errors are returned at once with the coordinator's code and
// message. A retried call may reach the coordinator twice when the first
// attempt was applied but its answer lost (the coordinator restarted in
// between): Set, Get, Wait, Delete, List and Join are idempotent; Add and
// CompareAndSet carry a request id, the same in every attempt, with which
// the coordinator answers a retry of one it applied as it answered the
// first (kv.proto). Thread-safe; one channel (connection) per route.
class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  // INVALID_ARGUMENT when `options.target` is not HOST:PORT[,...];
  // MakeChannelCredentials' errors for `options.tls`. Does not connect yet:
  // the first call does.
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Create(
      ClientOptions options);

  absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& request,
                                      absl::Duration max_wait) override;
  absl::StatusOr<std::vector<v1::Assignment>> JoinNode(
      const v1::JoinNodeRequest& request, absl::Duration max_wait) override;
  absl::Status Leave(const std::string& job_id,
                     const std::string& incarnation_id) override;
  absl::Status Set(const v1::Scope& scope, const std::string& key,
                   const std::string& value) override;
  absl::StatusOr<std::string> Get(const v1::Scope& scope,
                                  const std::string& key) override;
  absl::StatusOr<int64_t> Add(const v1::Scope& scope, const std::string& key,
                              int64_t delta) override;
  absl::StatusOr<v1::CompareAndSetResponse> CompareAndSet(
      const v1::CompareAndSetRequest& request) override;
  absl::Status Wait(const v1::Scope& scope, const std::vector<std::string>& keys,
                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(const v1::Scope& scope,
                              const std::string& key) override;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const v1::Scope& scope, const std::string& prefix,
      bool keys_only) override;
  absl::StatusOr<v1::CreateJobResponse> CreateJob(
      const v1::JobConfig& config) override;
  absl::StatusOr<std::string> RotateToken(const std::string& job_id) override;
  absl::Status RevokeToken(const std::string& job_id) override;
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id,
                                       bool with_buckets) override;
  absl::StatusOr<v1::GetJobResponse> QueryJob(
      const v1::GetJobRequest& request) override;
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs() override;
  absl::Status WatchJob(
      const std::string& job_id, absl::Duration min_interval, bool with_buckets,
      const std::function<bool(const v1::JobStatus&)>& on_status,
      const v1::MemberQuery& members) override;
  std::unique_ptr<HeartbeatStream> OpenHeartbeatStream(
      std::function<void(const v1::HeartbeatResponse&)> on_response) override;
  std::unique_ptr<NodeHeartbeatStream> OpenNodeHeartbeatStream(
      std::function<void(const v1::NodeHeartbeatResponse&)> on_response)
      override;
  absl::StatusOr<v1::JobState> ReportCompletion(
      const v1::ReportCompletionRequest& request) override;
  std::string target() const override { return options_.target; }

 private:
  // Where calls go: a channel and its stubs, for the list of replicas or
  // for the leader a standby named. Replaced as a whole, so that a call
  // keeps the one it started on.
  struct Route {
    Route(std::string target, bool to_leader,
          const grpc::ChannelArguments& args,
          const std::shared_ptr<grpc::ChannelCredentials>& credentials);
    std::string target;  // gRPC's
    bool to_leader;      // a standby named it
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Rendezvous::Stub> rendezvous;
    std::unique_ptr<v1::KeyValue::Stub> kv;
    std::unique_ptr<v1::Jobs::Stub> jobs;
    std::unique_ptr<v1::Monitor::Stub> monitor;
    std::unique_ptr<v1::Tokens::Stub> tokens;
  };
  using Attempt =
      std::function<grpc::Status(grpc::ClientContext*, const Route&)>;

  GrpcCoordinatorClient(ClientOptions options, grpc::ChannelArguments args,
                    std::shared_ptr<grpc::ChannelCredentials> credentials,
                    std::string target);

  std::shared_ptr<const Route> route() const;
  // What to check when the coordinator cannot be reached, for errors.
  std::string UnreachableHint() const;
  // The error of a call whose retries ended (`attempts` over `spent`, the
  // last one ending `last`): UNAVAILABLE naming what to check, or
  // RESOURCE_EXHAUSTED when the coordinator's transport kept shedding it.
  absl::Status GaveUp(const char* what, const grpc::Status& last, int attempts,
                      absl::Duration spent) const;
  // After a call over `used` ended UNAVAILABLE (`status`, with `context`'s
  // trailing metadata): when a standby named the leader, calls go there from now on
  // (true: try again at once); when a leader followed before went away,
  // they go back to the list of replicas.
  bool Reroute(const grpc::ClientContext& context, const grpc::Status& status,
               const Route& used);
  // Tells options_.on_term the term stamp of an answer, when it has one.
  void TellTerm(const char* what, const grpc::ClientContext& context) const;

  // Where a call's deadline is kept.
  enum class Deadline {
    // Sent with the call (gRPC's deadline): the coordinator ends it too.
    kSent,
    // Kept here: the call is cancelled when it passes. For calls that wait
    // long on the coordinator (joins), which then keeps no timer per waiting
    // call (Debian's gRPC checks each timer against every other in the
    // process; 100,000 waiting joins cost seconds).
    kLocal,
  };
  // Runs `attempt` with a fresh context whose deadline is `timeout` away,
  // retrying UNAVAILABLE, and calls the coordinator's transport shed to free
  // memory, per the retry policy. `what` names the call in errors.
  absl::Status Call(const char* what, absl::Duration timeout,
                    const Attempt& attempt, Deadline deadline = Deadline::kSent);

  // Opens a heartbeat stream of Monitor's `method`.
  template <typename Request, typename Response>
  std::unique_ptr<OutgoingStream<Request>> OpenStream(
      void (v1::Monitor::Stub::async::*method)(
          grpc::ClientContext*, grpc::ClientBidiReactor<Request, Response>*),
      std::function<void(const Response&)> on_response);

  // Adds the token's metadata to `context` (when there is a token).
  void Authorize(grpc::ClientContext* context) const;

  const ClientOptions options_;
  // "Bearer TOKEN", or empty without a token.
  const std::string authorization_;
  const grpc::ChannelArguments args_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const std::shared_ptr<const Route> replicas_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Route> route_ ABSL_GUARDED_BY(mu_);
  // The leader last followed and the route last found unreachable, so that
  // a stale leader named again and again is logged once.
  std::string last_leader_ ABSL_GUARDED_BY(mu_);
  std::string last_unreachable_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_CLIENT_GRPC_COORDINATOR_CLIENT_H_
