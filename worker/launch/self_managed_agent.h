// SelfManagedAgent: `gradsync launch` for processes that heartbeat and
// rejoin on their own (LaunchOptions::self_managed: gradsync-worker, or
// --self_managed). The agent joins once for the node's processes and hands
// each its first assignment (launched_process.h); from then on the
// processes keep their places themselves. When one fails, the agent
// restarts that process alone, as a new incarnation asking for the local
// rank (on a GPU, the device) it left free (JoinRequest.local_slot): it
// joins by itself and takes its place while the others re-form in place.
// Out of restarts (--max_restarts), the agent joins in the failed process's
// place only to report the failure, so that the job fails with its exit
// code. Their output is labelled by local slot ("local1"): ranks change as
// the processes re-form. NodeAgent (node_agent.h) is the torchrun mode,
// which restarts the whole group.
#ifndef GRADSYNC_WORKER_LAUNCH_SELF_MANAGED_AGENT_H_
#define GRADSYNC_WORKER_LAUNCH_SELF_MANAGED_AGENT_H_

#include <string>
#include <vector>

#include "worker/client/coordinator_client.h"
#include "worker/launch/launch_options.h"
#include "worker/launch/node_processes.h"

namespace gradsync {

// Run() is called once, from one thread; RequestStop() may be called from
// any thread. `client` must outlive the agent.
class SelfManagedAgent {
 public:
  // `environment`: the "NAME=VALUE" entries the processes inherit.
  SelfManagedAgent(LaunchOptions options, CoordinatorClient* client,
                   std::vector<std::string> environment);

  // Runs until every process exited 0 (returns 0), one failed with no
  // restarts left (its exit code), or a stop (128 + signal); 1 when the
  // node cannot join or a process cannot start, 2 when the join requests
  // cannot be built.
  int Run();

  // Stops the processes (or the join in progress) and makes Run() return
  // 128 + `signal`.
  void RequestStop(int signal) { processes_.RequestStop(signal); }

 private:
  // Starts every slot's process with its first assignment.
  absl::Status StartAll();
  // Starts slot `i` again as a new incarnation (restart `restart`).
  void Restart(size_t i, int restart);
  // Out of restarts: makes the job fail with slot `i`'s exit code (see the
  // definition for how).
  void ReportPermanentFailure(size_t i, int exit_code,
                              const std::string& message);

  const LaunchOptions options_;
  CoordinatorClient* const client_;
  NodeProcesses processes_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_SELF_MANAGED_AGENT_H_
