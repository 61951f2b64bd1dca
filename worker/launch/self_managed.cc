// NodeAgent's mode for processes that heartbeat and rejoin on their own
// (LaunchOptions::self_managed, gradsync-worker): the agent hands them their
// first assignment and restarts only a process that fails, which rejoins as
// a new incarnation while the others re-form in place. The torchrun mode,
// which restarts the whole group, is in node_agent.cc.
#include "worker/launch/node_agent.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/runtime/join.h"
#include "worker/runtime/launched_process.h"

namespace gradsync {
namespace {

// How long a self-managed process's permanent failure waits for its peers'
// new round, to be reported in it.
constexpr absl::Duration kFailureJoinWait = absl::Seconds(60);

}  // namespace

int NodeAgent::RunSelfManaged() {
  absl::Status joined = JoinRound(0);
  if (StopCode() != 0) return StopCode();
  if (!joined.ok()) {
    GS_LOG(ERROR) << "gradsync launch: cannot join job '" << options_.job
                  << "': " << joined;
    return 1;
  }
  {
    absl::MutexLock lock(&mu_);
    exits_.assign(slots_.size(), std::nullopt);
  }
  AgentContext context;
  context.role = options_.role;
  context.coordinator = options_.coordinator;
  context.max_restarts = options_.max_restarts;
  for (size_t i = 0; i < slots_.size(); ++i) {
    std::map<std::string, std::string> variables =
        TorchrunVariables(slots_[i].assignment, context);
    variables.merge(LaunchedProcessVariables(
        options_.coordinator, slots_[i].request, &slots_[i].assignment));
    absl::Status started = StartProcess(i, variables, 0);
    if (!started.ok()) {
      GS_LOG(ERROR) << "gradsync launch: " << started.message();
      StopProcesses();
      return 1;
    }
  }
  for (int restarts = 0;;) {
    const Outcome outcome = Supervise();
    if (outcome.kind == Outcome::kSucceeded) return 0;
    if (outcome.kind == Outcome::kStopped || restarts == options_.max_restarts) {
      if (outcome.kind == Outcome::kFailed) {
        const std::string what = Describe(outcome, 0);
        GS_LOG(ERROR) << "gradsync launch: " << what
                      << "; no restarts left (--max_restarts="
                      << options_.max_restarts << ")";
        ReportPermanentFailure(slots_[outcome.slot], outcome.exit_code, what);
      }
      StopProcesses();
      return outcome.exit_code;
    }
    ++restarts;
    GS_LOG(WARNING) << "gradsync launch: " << Describe(outcome, 0)
                    << "; restarting that process alone (restart " << restarts
                    << " of " << options_.max_restarts
                    << "): it rejoins and the others re-form in place";
    RestartProcess(outcome.slot, restarts);
  }
}

void NodeAgent::ReportPermanentFailure(const Slot& slot, int exit_code,
                                       const std::string& message) {
  // The coordinator found the process lost and its peers are re-forming,
  // waiting for a replacement. The agent joins in its place, only to report
  // that it failed for good: the job fails with its exit code, and the
  // peers learn it from their heartbeat answers.
  v1::JoinRequest request = slot.request;
  request.mutable_node()->set_incarnation_id(NewIncarnationId());
  absl::StatusOr<v1::Assignment> joined =
      client_->Join(request, std::min(options_.join_timeout, kFailureJoinWait));
  if (!joined.ok()) {
    GS_LOG(WARNING) << "gradsync launch: cannot report the failure "
                       "(joining to report it: "
                    << joined.status() << ")";
    return;
  }
  v1::ReportCompletionRequest report;
  report.mutable_member()->set_job_id(joined->job_id());
  report.mutable_member()->set_round(joined->round());
  report.mutable_member()->set_rank(joined->rank());
  report.mutable_member()->set_incarnation_id(request.node().incarnation_id());
  report.set_success(false);
  report.set_exit_code(exit_code);
  report.set_message(message);
  absl::StatusOr<v1::JobState> state = client_->ReportCompletion(report);
  if (!state.ok()) {
    GS_LOG(WARNING) << "gradsync launch: cannot report the failure: "
                    << state.status();
  }
}

void NodeAgent::RestartProcess(int i, int restart) {
  Slot& slot = slots_[i];
  slot.reaper.join();  // it has exited
  slot.process.reset();
  {
    absl::MutexLock lock(&mu_);
    exits_[i].reset();
  }
  // A new incarnation on this node: the coordinator takes it as the lost
  // process's replacement, which copies the state from the others. It asks
  // for the local rank (on a GPU, the device) the lost process left free:
  // the survivors keep theirs (JoinRequest.local_slot).
  slot.request.mutable_node()->set_incarnation_id(NewIncarnationId());
  slot.request.set_local_slot(slot.assignment.local_rank());
  std::map<std::string, std::string> variables =
      LaunchedProcessVariables(options_.coordinator, slot.request, nullptr);
  variables["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(restart);
  variables["GRADSYNC_JOB"] = options_.job;
  absl::Status started = StartProcess(i, variables, restart);
  if (!started.ok()) {
    GS_LOG(ERROR) << "gradsync launch: cannot restart the process of rank "
                  << slot.assignment.rank() << ": " << started.message();
    absl::MutexLock lock(&mu_);
    exits_[i] = 1;
  }
}

}  // namespace gradsync
