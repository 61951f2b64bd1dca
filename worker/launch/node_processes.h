// NodeProcesses: what both kinds of node agent do with a node's local
// processes, across rounds: one join request per process (its incarnation
// kept until the agent replaces it), the node's joins (one JoinNode call),
// starting a process with its environment and output (OutputPump, per
// --log_dir/--redirects/--tee), its exit, the stacks of a running process
// (for hang verdicts), stopping them all, and a stop request from a signal.
//
// The supervision policy is the agents': NodeAgent (node_agent.h) restarts
// the whole group as torchrun does; SelfManagedAgent (self_managed_agent.h)
// restarts one process of gradsync's own trainer.
//
// Thread-safety: RequestStop, Interrupt and Stacks may be called from any
// thread; everything else from the agent's one thread. `client` must outlive
// it. The destructor stops the processes still running.
#ifndef GRADSYNC_WORKER_LAUNCH_NODE_PROCESSES_H_
#define GRADSYNC_WORKER_LAUNCH_NODE_PROCESSES_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "worker/client/coordinator_client.h"
#include "worker/launch/launch_options.h"
#include "worker/launch/local_process.h"
#include "worker/launch/output_pump.h"

namespace gradsync {

// How the processes of one attempt (a round) ended, or why an agent gave up
// on them.
struct NodeOutcome {
  enum Kind {
    kSucceeded,  // every process of the node exited 0
    kFailed,     // process `slot` (pid `pid`) exited with `exit_code`
    kRoundOver,  // the coordinator ended the round (another node's failure)
    kJobFailed,  // the coordinator failed the job: final
    kStopped,    // RequestStop: final, exit_code 128 + signal
    kError,      // anything else (cannot start the program): final
  } kind = kSucceeded;
  int slot = -1;
  int exit_code = 0;
  absl::Status status;  // why, for every kind but kFailed and kSucceeded
  int64_t pid = 0;      // kFailed: the process that exited
};

class NodeProcesses {
 public:
  // `environment`: the "NAME=VALUE" entries the processes inherit.
  NodeProcesses(const LaunchOptions& options, CoordinatorClient* client,
                std::vector<std::string> environment);
  ~NodeProcesses();
  NodeProcesses(const NodeProcesses&) = delete;
  NodeProcesses& operator=(const NodeProcesses&) = delete;

  // Builds one join request per local process (--nproc_per_node), with
  // fresh incarnations; the devices the round's backend negotiation sees
  // are this machine's NVIDIA GPUs. Called once, before anything else.
  absl::Status Prepare();
  size_t size() const { return slots_.size(); }
  // Slot `i`'s join request (its incarnation; the agent may replace it) and
  // its assignment in the last round joined. Slots are in local-rank order
  // once joined.
  v1::JoinRequest& request(size_t i) { return slots_[i].request; }
  const v1::Assignment& assignment(size_t i) const {
    return slots_[i].assignment;
  }
  // The running process of slot `i`, or nullptr.
  const LocalProcess* process(size_t i) const { return slots_[i].process.get(); }

  // Joins the next round for every slot in one call; `reason` (may be
  // empty) says why they rejoin, the round's recovery cause. CANCELLED when
  // a stop was requested, before or while it waited.
  absl::Status JoinRound(int64_t last_round, const std::string& reason = "");

  // Starts slot `i`'s process with `variables` set, its output labelled
  // `label` ("rank3", "local1") in attempt `restart`. The slot must have no
  // process (StopAll() or Reap() first).
  absl::Status Start(size_t i,
                     const std::map<std::string, std::string>& variables,
                     int restart, const std::string& label);

  // Waits up to `timeout` for the attempt to be decided: a stop request, a
  // process that exited non-zero (kFailed), an Interrupt() (kRoundOver, or
  // kJobFailed for FAILED_PRECONDITION), or every process exited 0. nullopt
  // when nothing was decided in time.
  std::optional<NodeOutcome> Await(absl::Duration timeout);
  // Ends the attempt with `why` (the coordinator ended the round); the
  // first call counts until the next Start of every slot (ResetAttempt).
  void Interrupt(const absl::Status& why);
  // Forgets the last attempt's exits and interruption: a new attempt.
  void ResetAttempt();
  // Slot `i`'s exit code, nullopt while its process runs (or none ran).
  std::optional<int> exit_code(size_t i) const;

  // Stops the processes still running (SIGTERM, then SIGKILL after
  // --stop_timeout) and waits for them and their output.
  void StopAll();
  // Slot `i`'s process has exited: releases it, so that it may Start again.
  void Reap(size_t i);
  // Records that slot `i` ended with `code` without a process (it could not
  // be started again).
  void MarkExited(size_t i, int code);

  // Makes joins and Await return: 128 + `signal` is the agent's exit code.
  void RequestStop(int signal);
  // Waits up to `timeout` for a stop request; whether one came.
  bool AwaitStop(absl::Duration timeout) const;
  // 128 + the stop signal, or 0 when none was requested.
  int StopCode() const;

  // The stacks of the process started for incarnation `incarnation_id`,
  // answering the coordinator's request `request`.
  v1::ThreadStacks Stacks(const std::string& incarnation_id,
                          int64_t request) const;

  // What went wrong in `outcome` of round `round`, for logs and reports.
  std::string Describe(const NodeOutcome& outcome, int64_t round) const;

 private:
  // One local process slot, across rounds.
  struct Slot {
    v1::JoinRequest request;
    v1::Assignment assignment;
    std::unique_ptr<LocalProcess> process;
    std::thread reaper;
  };
  // A process and its stacks file (empty: none), for Stacks.
  struct StackTarget {
    pid_t pid = 0;
    std::string file;
  };

  // Where stream `stream` (1 stdout, 2 stderr) of the process of local rank
  // `local_rank`, labelled `label`, goes in attempt `restart`.
  OutputSink SinkFor(const std::string& label, int local_rank, int restart,
                     int stream) const;
  // The decided outcome, if any (see Await).
  std::optional<NodeOutcome> DecidedLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LaunchOptions options_;
  CoordinatorClient* const client_;
  const std::vector<std::string> environment_;
  std::vector<Slot> slots_;
  OutputPump output_;

  mutable absl::Mutex mu_;
  int stop_signal_ ABSL_GUARDED_BY(mu_) = 0;
  bool joining_ ABSL_GUARDED_BY(mu_) = false;
  // Exit codes of this attempt's processes, by slot; nullopt while running.
  std::vector<std::optional<int>> exits_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> interrupted_ ABSL_GUARDED_BY(mu_);
  // By incarnation.
  std::map<std::string, StackTarget> stack_targets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_NODE_PROCESSES_H_
