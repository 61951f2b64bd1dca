// NodeAgent: the heart of `gradsync launch`. It joins the job's rendezvous
// once per local process (all with this node's node_id, so they form one
// node), starts the processes with torchrun's environment, heartbeats for
// each of them (alive, RSS, CPU time, GPU memory, exit code) so the
// coordinator's status shows every rank, and supervises them with torchrun's
// contract:
//   - every process exits 0: the members report success; the agent exits 0;
//   - a process exits non-zero: the agent stops the others and rejoins,
//     which supersedes the round; the other nodes' agents are told by their
//     heartbeat answers, stop theirs and rejoin; the group re-forms in a new
//     round and every process restarts with TORCHELASTIC_RESTART_COUNT + 1,
//     at most --max_restarts times; then the failure is reported (the job
//     FAILS with that exit code) and the agent exits with it;
//   - SIGINT, SIGTERM, SIGHUP or SIGQUIT (RequestStop): the processes get
//     SIGTERM, then SIGKILL after --stop_timeout; the failure is reported;
//     exit 128 + signal.
// Processes that report their own metrics (gradsync.torch.monitor: steps,
// bucket timings, collective fingerprints, for hang and desync diagnosis)
// send them to the agent (GRADSYNC_AGENT_SOCKET, MetricsInbox), which folds
// them into their members' heartbeats.
// gradsync's own trainer (--self_managed) heartbeats and heals by itself:
// SelfManagedAgent (self_managed_agent.h) runs its processes instead.
// Node rank 0's agent picks MASTER_PORT and publishes it with its address
// in the round's key-value store; the others read it there.
#ifndef GRADSYNC_WORKER_LAUNCH_NODE_AGENT_H_
#define GRADSYNC_WORKER_LAUNCH_NODE_AGENT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "worker/backend/store.h"
#include "worker/client/coordinator_client.h"
#include "worker/launch/launch_options.h"
#include "worker/launch/metrics_inbox.h"
#include "worker/launch/node_processes.h"
#include "worker/launch/torchrun_env.h"
#include "worker/runtime/health_reporter.h"
#include "worker/runtime/node_heartbeats.h"

namespace gradsync {

// Runs one node's processes with torchrun's contract (see above). Run() is
// called once, from one thread; RequestStop() may be called from any
// thread. `client` must outlive the agent.
class NodeAgent {
 public:
  // `environment`: the "NAME=VALUE" entries the processes inherit.
  NodeAgent(LaunchOptions options, CoordinatorClient* client,
            std::vector<std::string> environment);
  ~NodeAgent();

  // Runs until the job ends for this node. Returns the agent's exit code:
  // 0 when every local process succeeded, the failed process's exit code
  // once restarts are used up, 128 + signal when stopped, 1 for any other
  // error (logged), 2 when the processes' join requests cannot be built.
  int Run();

  // Stops the processes (or a join in progress) and makes Run() return
  // 128 + `signal`.
  void RequestStop(int signal) { processes_.RequestStop(signal); }

 private:
  // Creates a reporter per slot, reporting for its incarnation.
  void CreateReporters();
  HealthReporter& reporter(size_t slot);
  // Starts the round's processes and supervises them until an outcome;
  // they are stopped on return.
  NodeOutcome RunProcesses(int restart);
  // Reports the node's success, then waits (like torchrun's exit barrier)
  // until the job succeeds (kSucceeded), fails (kJobFailed), its round is
  // superseded (kRoundOver: a process of another node failed) or the agent
  // is stopped.
  NodeOutcome ReportSuccess(int64_t round);
  // Waits for the job's end or a later round, or a stop.
  NodeOutcome AwaitJobEnd(int64_t round);
  // For an outcome other than success or a stop: nullopt when the group
  // restarts (restarts are left and it can help), else the exit code, once
  // the failure is reported.
  std::optional<int> GiveUp(const NodeOutcome& outcome, int restart,
                            int64_t round);
  absl::StatusOr<AgentContext> ExchangeMaster(int restart);
  // Node rank 0's "ADDR PORT" from the round's `store`, waited for up to
  // --join_timeout; CANCELLED once a stop was requested.
  absl::StatusOr<std::string> AwaitMaster(Store* store);
  absl::Status StartProcesses(const AgentContext& context);
  NodeOutcome Supervise();
  // Stops the processes still running and forgets their reports.
  void StopProcesses();
  // GPU memory by pid (nvidia-smi, at most 2 s); empty without GPUs, or
  // for a minute after a query timed out.
  std::map<pid_t, int64_t> GpuMemory();
  void ReportMetrics();
  // A process's own metrics (MetricsInbox): kept as its snapshot and passed
  // on to its member's reporter at once.
  void OnProcessMetrics(const v1::HeartbeatRequest& message);

  const LaunchOptions options_;
  CoordinatorClient* const client_;
  const int gpus_;  // NVIDIA GPUs on this machine (CountGpus)
  // No nvidia-smi query before then (it timed out). Run's thread only.
  absl::Time gpu_query_paused_until_ = absl::InfinitePast();
  // The node's one heartbeat stream, which its ranks' reporters share.
  NodeHeartbeats heartbeats_;
  NodeProcesses processes_;
  // By incarnation (the slots' are kept across rounds).
  std::map<std::string, std::unique_ptr<HealthReporter>> reporters_;
  std::unique_ptr<MetricsInbox> inbox_;  // null when it could not be opened

  mutable absl::Mutex mu_;
  // The running attempt's round and its processes by rank, for
  // OnProcessMetrics (0 and empty between attempts).
  int64_t running_round_ ABSL_GUARDED_BY(mu_) = 0;
  struct Reported {
    HealthReporter* reporter;
    v1::WorkerMetrics metrics;  // the process's latest (no events)
    int64_t rss_bytes = 0;      // sampled by the agent
    double cpu_seconds = 0;     // sampled by the agent
    int64_t gpu_memory_bytes = 0;  // sampled by the agent (nvidia-smi)
    int64_t pid = 0;               // the process's own (the agent joined)
  };
  std::map<int, Reported> reported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_NODE_AGENT_H_
