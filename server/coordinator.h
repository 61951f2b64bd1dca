// The coordinator service, assembled: storage, the four managers, their
// gRPC services, grpc.health.v1, reflection, RPC statistics, the Prometheus
// metrics endpoint, and the poller that drives time-based transitions. main() and the integration tests both use it.
#ifndef GRADSYNC_SERVER_COORDINATOR_H_
#define GRADSYNC_SERVER_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/authenticator.h"
#include "server/completion_queues.h"
#include "server/connection_limits.h"
#include "server/health_manager.h"
#include "server/job_manager.h"
#include "server/jobs_service.h"
#include "server/kv_manager.h"
#include "server/kv_service.h"
#include "server/http/http_server.h"
#include "server/health_service.h"
#include "server/rendezvous_manager.h"
#include "server/rendezvous_service.h"
#include "server/rpc_stats.h"
#include "server/storage/storage.h"
#include "server/tokens_service.h"

namespace gradsync {

struct CoordinatorConfig {
  // Address to serve on, "HOST:PORT"; port 0 picks a free port (see port()).
  std::string listen_address = "0.0.0.0:29400";
  // How often timeouts (last call, join, key waits) are checked; their
  // resolution.
  absl::Duration poll_interval = absl::Milliseconds(10);
  // How long Shutdown() lets in-flight calls finish before cancelling them.
  absl::Duration shutdown_grace = absl::Seconds(2);
  KvLimits kv_limits;
  JobLimits job_limits;
  // With a token: --auth=token, this the admin's (Authenticator); empty:
  // every caller may do anything.
  std::string admin_token;
  // Failure detection defaults (jobs may override them in their config).
  HealthConfig health;
  // How long a job that SUCCEEDED or FAILED stays queryable.
  absl::Duration retention = absl::Hours(1);
  // "HOST:PORT" to serve Prometheus metrics on (GET /metrics); empty: none.
  std::string metrics_listen_address;
  // Completion queues (and threads) for heartbeat streams and joins; see
  // CompletionQueues for why more than one.
  int completion_queues = 32;
  // Heartbeat streams and watches one client connection may hold at once;
  // 0: no limit.
  int max_streams_per_connection = 1024;
  // Heartbeats handled per second at most, shared fairly across jobs
  // (HeartbeatPacer; the rest wait in the connections, as past a real
  // capacity); 0: no cap.
  double max_heartbeat_rate = 0;
  // Hold back what heartbeat streams send faster than the coordinator asked
  // (HeartbeatPolicer); false reads every message as it comes.
  bool police_heartbeats = true;
  // Let gRPC grow each stream's receive window with the bandwidth-delay
  // product it measures (its BDP probe). false keeps HTTP/2's 64 KiB: a
  // stream held back then buffers at most that (measured: 0.2 MiB a held
  // heartbeat stream against 4.3 MiB with 10 held, 4-11 MiB with 40), and
  // a message larger than it takes about one round trip more.
  bool grow_receive_windows = true;
  // Bytes gRPC may hold for this server's connections (read buffers,
  // calls, messages received and not yet read), all of them together: a
  // grpc::ResourceQuota. Near it gRPC shrinks receive windows, so senders
  // wait; past it, gRPC ends streams (RESOURCE_EXHAUSTED) and idle
  // connections rather than the process running out of memory (measured:
  // 40 held heartbeat streams buffer about twice the limit in all, not
  // 4-11 MiB each). 0: no limit (gRPC's default).
  int64_t transport_memory_limit = 0;
  // The term this replica leads in (under etcd leadership: its leader key's
  // create revision), sent with every key-value answer
  // (common/leader_term.h); 0: none (one coordinator).
  int64_t leader_term = 0;
  // Time source; nullptr means the real clock. Must outlive the coordinator.
  Clock* clock = nullptr;
  // Where jobs and keys are kept (e.g. a SqliteStorage for --state_dir);
  // nullptr means in memory, lost on exit. Must outlive the coordinator.
  Storage* storage = nullptr;
  // Transport security of the gRPC port (MakeServerCredentials); nullptr:
  // plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // PEM files for HTTPS on the metrics port (the gRPC port's --tls_cert and
  // --tls_key); empty: plain HTTP.
  std::string http_tls_cert, http_tls_key;
};

// Lifetime: construct, Start() once, then Shutdown() (or destroy). Start and
// Shutdown are not thread-safe with each other; everything else the
// coordinator does is.
class Coordinator {
 public:
  explicit Coordinator(CoordinatorConfig config);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Binds the listen address and starts serving. UNAVAILABLE when the address
  // cannot be bound.
  absl::Status Start();

  // The port the server listens on (valid after Start()).
  int port() const { return port_; }
  // The metrics port (valid after Start() with a metrics address).
  int metrics_port() const { return metrics_.port(); }

  // Stops accepting calls, lets in-flight ones finish for shutdown_grace,
  // cancels the rest and stops the poller. Idempotent.
  void Shutdown();

  // Blocks until Shutdown() has completed.
  void Wait();

  JobManager& jobs() { return jobs_; }
  KvManager& kv() { return kv_; }
  RendezvousManager& rendezvous() { return rendezvous_; }
  HealthManager& health() { return health_; }

  // The Prometheus exposition of the coordinator's metrics.
  std::string RenderMetrics() const;

 private:
  void PollLoop();
  // Tells health_ how late the completion queues run what arrives now
  // (each queue's and the largest) and, under a rate cap, how long each
  // job's heartbeats wait for turns, for failure detection under overload.
  void ReportQueueDelays();
  // The HTTP port's routes: /metrics, the status page (/) and its JSON
  // (/api/jobs, /api/job?id=JOB).
  std::vector<HttpRoute> HttpRoutes();
  // The members /api/job lists, from its query parameters: members=all,
  // unhealthy, none or auto (the default: all up to kStatusPageAllUpTo
  // ranks, else the unhealthy), from=RANK, to=RANK (exclusive) and
  // limit=N (kStatusPageListed for the unhealthy by default).
  absl::StatusOr<v1::MemberQuery> StatusPageQuery(
      const std::string& job_id,
      const std::map<std::string, std::string>& params) const;
  static constexpr int kStatusPageAllUpTo = 64;
  static constexpr int kStatusPageListed = 200;
  // Loads the jobs kept in storage and reopens their key-value rounds.
  absl::Status RestoreFromStorage();

  const CoordinatorConfig config_;
  // Members in dependency order: each uses only those declared above it, so
  // they are built top-down and destroyed bottom-up; the one exception is
  // the rendezvous's listeners (kv_ above it, health_ below), which it calls
  // only between Start() (restore) and Shutdown(), when every member exists.
  Clock* const clock_;
  std::unique_ptr<Storage> owned_storage_;  // when config.storage is null
  Storage* const storage_;
  Authenticator auth_;
  JobManager jobs_;
  KvManager kv_;
  RendezvousManager rendezvous_;
  HealthManager health_;
  RpcStats rpc_stats_;
  ConnectionLimits stream_limits_;
  RendezvousService rendezvous_service_;
  KvService kv_service_;
  JobsService jobs_service_;
  TokensService tokens_service_;
  HealthService health_service_;
  CompletionQueues queues_;  // shut down before the services go
  HttpServer metrics_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stop_polling_;
  std::thread poller_;
  absl::Notification shut_down_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_COORDINATOR_H_
