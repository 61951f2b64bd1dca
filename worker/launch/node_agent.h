// NodeAgent: the heart of `gradsync launch`. It joins the job's rendezvous
// once per local process (all with this node's node_id, so they form one
// node), starts the processes with torchrun's environment, heartbeats for
// each of them (alive, RSS, CPU time, GPU memory, exit code) so the coordinator's status shows
// every rank, and supervises them with torchrun's contract:
//   - every process exits 0: the members report success; the agent exits 0;
//   - a process exits non-zero: the agent stops the others and rejoins,
//     which supersedes the round; the other nodes' agents are told by their
//     heartbeat answers, stop theirs and rejoin; the group re-forms in a new
//     round and every process restarts with TORCHELASTIC_RESTART_COUNT + 1,
//     at most --max_restarts times; then the failure is reported (the job
//     FAILS with that exit code) and the agent exits with it;
//   - SIGINT/SIGTERM (RequestStop): the processes get SIGTERM, then SIGKILL
//     after --stop_timeout; the failure is reported; exit 128 + signal.
// Processes that report their own metrics (gradsync.torch.monitor: steps,
// bucket timings, collective fingerprints, for hang and desync diagnosis)
// send them to the agent (GRADSYNC_AGENT_SOCKET, MetricsInbox), which folds
// them into their members' heartbeats.
// gradsync's own trainer (--self_managed) heartbeats and heals by itself:
// the agent hands each process its first assignment (launched_process.h)
// and restarts only a process that fails, which rejoins and takes its
// place while the others re-form in place (self_managed.cc).
// Node rank 0's agent picks MASTER_PORT and publishes it with its address
// in the round's key-value store; the others read it there.
#ifndef GRADSYNC_WORKER_LAUNCH_NODE_AGENT_H_
#define GRADSYNC_WORKER_LAUNCH_NODE_AGENT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "worker/client/coordinator_client.h"
#include "worker/launch/launch_options.h"
#include "worker/launch/local_process.h"
#include "worker/launch/metrics_inbox.h"
#include "worker/launch/output_pump.h"
#include "worker/launch/torchrun_env.h"
#include "worker/runtime/health_reporter.h"
#include "worker/runtime/node_heartbeats.h"

namespace gradsync {

// Runs one node's processes. Run() is called once, from one thread;
// RequestStop() may be called from any thread. `client` must outlive the
// agent.
class NodeAgent {
 public:
  // `environment`: the "NAME=VALUE" entries the processes inherit.
  NodeAgent(LaunchOptions options, CoordinatorClient* client,
            std::vector<std::string> environment);
  ~NodeAgent();

  // Runs until the job ends for this node. Returns the agent's exit code:
  // 0 when every local process succeeded, the failed process's exit code
  // once restarts are used up, 128 + signal when stopped, 1 for any other
  // error (logged).
  int Run();

  // Stops the processes (or a join in progress) and makes Run() return
  // 128 + `signal`.
  void RequestStop(int signal);

 private:
  // One local process slot, across rounds.
  struct Slot {
    v1::JoinRequest request;  // its incarnation is kept across rounds
    std::unique_ptr<HealthReporter> reporter;
    v1::Assignment assignment;
    std::unique_ptr<LocalProcess> process;
    std::thread reaper;
  };
  // How one attempt (the processes of one round) ended.
  struct Outcome {
    enum Kind {
      kSucceeded,  // every process of the node exited 0 (the job too, after
                   // ReportSuccess)
      kFailed,     // process `slot` exited with `exit_code`: restartable
      kRoundOver,  // the round was superseded (another node): restartable
      kJobFailed,  // the coordinator failed the job: final
      kStopped,    // RequestStop: final, exit_code 128 + signal
      kError,      // anything else (cannot start the program): final
    } kind = kSucceeded;
    int slot = -1;
    int exit_code = 0;
    absl::Status status;  // why, for every kind but kFailed and kSucceeded
    int64_t pid = 0;      // kFailed: the process that exited
  };

  // Builds the slots' join requests (fresh incarnations kept across rounds).
  absl::Status PrepareSlots();
  // Joins the next round for the node's processes; `reason` (may be empty)
  // says why they rejoin: the round's recovery cause.
  absl::Status JoinRound(int64_t last_round, const std::string& reason = "");
  // Starts the round's processes and supervises them until an outcome;
  // they are stopped on return.
  Outcome RunProcesses(int restart);
  // Starts slot `i`'s process with `variables` set; its reaper records its
  // exit in exits_[i].
  absl::Status StartProcess(size_t i,
                            const std::map<std::string, std::string>& variables,
                            int restart);
  // For processes that heartbeat and rejoin on their own
  // (LaunchOptions::self_managed, launched_process.h): starts them with the
  // agent's first assignment and restarts only a process that fails, as a
  // new incarnation that joins by itself; the others re-form in place.
  int RunSelfManaged();
  void RestartProcess(int i, int restart);
  // Out of restarts: makes the job fail with `slot`'s exit code (see the
  // definition for how).
  void ReportPermanentFailure(const Slot& slot, int exit_code,
                              const std::string& message);
  // Reports the node's success, then waits (like torchrun's exit barrier)
  // until the job succeeds (kSucceeded), fails (kJobFailed), its round is
  // superseded (kRoundOver: a process of another node failed) or the agent
  // is stopped.
  Outcome ReportSuccess(int64_t round);
  // For an outcome other than success or a stop: nullopt when the group
  // restarts (restarts are left and it can help), else the exit code, once
  // the failure is reported.
  std::optional<int> GiveUp(const Outcome& outcome, int restart, int64_t round);
  absl::StatusOr<AgentContext> ExchangeMaster(int restart);
  absl::Status StartProcesses(const AgentContext& context);
  Outcome Supervise();
  // Stops the processes still running (SIGTERM, then SIGKILL) and waits for
  // them and their output.
  void StopProcesses();
  void ReportMetrics();
  // A process's own metrics (MetricsInbox): kept as its snapshot and passed
  // on to its member's reporter at once.
  void OnProcessMetrics(const v1::HeartbeatRequest& message);
  // The stacks of slot `i`'s process, answering the coordinator's request
  // `request` (on its reporter's thread).
  v1::ThreadStacks SlotStacks(size_t i, int64_t request) const;
  // Where stream `stream` (1 stdout, 2 stderr) of the process of local rank
  // `local_rank`, labelled `label` ("rank3", "local1"), goes in attempt
  // `restart`.
  OutputSink SinkFor(const std::string& label, int local_rank, int restart,
                     int stream) const;
  int StopCode() const;
  // What went wrong in `outcome` of round `round`, for logs and reports.
  std::string Describe(const Outcome& outcome, int64_t round) const;

  const LaunchOptions options_;
  CoordinatorClient* const client_;
  const std::vector<std::string> environment_;
  const int gpus_;  // NVIDIA GPUs on this machine (CountGpus)
  // The node's one heartbeat stream, which its ranks' reporters share.
  NodeHeartbeats heartbeats_;
  std::vector<Slot> slots_;  // by local rank once joined
  OutputPump output_;
  std::unique_ptr<MetricsInbox> inbox_;  // null when it could not be opened

  mutable absl::Mutex mu_;
  int stop_signal_ ABSL_GUARDED_BY(mu_) = 0;
  bool joining_ ABSL_GUARDED_BY(mu_) = false;
  // Exit codes of this attempt's processes, by slot; nullopt while running.
  std::vector<std::optional<int>> exits_ ABSL_GUARDED_BY(mu_);
  // Set by a reporter when the coordinator ends this round for a member.
  std::optional<absl::Status> round_over_ ABSL_GUARDED_BY(mu_);
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
  // By slot: its process and its stacks file (empty: none), for SlotStacks.
  struct StackTarget {
    pid_t pid = 0;
    std::string file;
  };
  std::vector<StackTarget> stack_targets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_NODE_AGENT_H_
