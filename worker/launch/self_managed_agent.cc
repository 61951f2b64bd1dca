#include "worker/launch/self_managed_agent.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/launch/torchrun_env.h"
#include "worker/runtime/launched_process.h"

namespace gradsync {
namespace {

// How long a self-managed process's permanent failure waits for its peers'
// new round, to be reported in it.
constexpr absl::Duration kFailureJoinWait = absl::Seconds(60);

std::string Label(size_t slot) { return absl::StrCat("local", slot); }

}  // namespace

SelfManagedAgent::SelfManagedAgent(LaunchOptions options,
                                   CoordinatorClient* client,
                                   std::vector<std::string> environment)
    : options_(std::move(options)),
      client_(client),
      processes_(options_, client, std::move(environment)) {}

int SelfManagedAgent::Run() {
  absl::Status prepared = processes_.Prepare();
  if (!prepared.ok()) {
    GS_LOG(ERROR) << "gradsync launch: " << prepared.message();
    return 2;
  }
  absl::Status joined = processes_.JoinRound(0);
  if (processes_.StopCode() != 0) return processes_.StopCode();
  if (!joined.ok()) {
    GS_LOG(ERROR) << "gradsync launch: cannot join job '" << options_.job
                  << "': " << joined;
    return 1;
  }
  absl::Status started = StartAll();
  if (!started.ok()) {
    GS_LOG(ERROR) << "gradsync launch: " << started.message();
    processes_.StopAll();
    return 1;
  }
  for (int restarts = 0;;) {
    std::optional<NodeOutcome> outcome;
    while (!outcome.has_value()) {
      outcome = processes_.Await(options_.monitor_interval);
    }
    if (outcome->kind == NodeOutcome::kSucceeded) return 0;
    const std::string what = processes_.Describe(*outcome, 0);
    if (outcome->kind == NodeOutcome::kStopped ||
        restarts == options_.max_restarts) {
      if (outcome->kind == NodeOutcome::kFailed) {
        GS_LOG(ERROR) << "gradsync launch: " << what
                      << "; no restarts left (--max_restarts="
                      << options_.max_restarts << ")";
        ReportPermanentFailure(outcome->slot, outcome->exit_code, what);
      }
      processes_.StopAll();
      return outcome->exit_code;
    }
    ++restarts;
    GS_LOG(WARNING) << "gradsync launch: " << what
                    << "; restarting that process alone (restart " << restarts
                    << " of " << options_.max_restarts
                    << "): it rejoins and the others re-form in place";
    Restart(outcome->slot, restarts);
  }
}

absl::Status SelfManagedAgent::StartAll() {
  AgentContext context;
  context.role = options_.role;
  context.coordinator = options_.coordinator;
  context.max_restarts = options_.max_restarts;
  for (size_t i = 0; i < processes_.size(); ++i) {
    std::map<std::string, std::string> variables =
        TorchrunVariables(processes_.assignment(i), context);
    variables.merge(LaunchedProcessVariables(
        options_.coordinator, processes_.request(i), &processes_.assignment(i)));
    absl::Status started = processes_.Start(i, variables, 0, Label(i));
    if (!started.ok()) return started;
  }
  return absl::OkStatus();
}

void SelfManagedAgent::Restart(size_t i, int restart) {
  processes_.Reap(i);  // it has exited
  // A new incarnation on this node: the coordinator takes it as the lost
  // process's replacement, which copies the state from the others. It asks
  // for the local rank (on a GPU, the device) the lost process left free:
  // the survivors keep theirs (JoinRequest.local_slot).
  v1::JoinRequest& request = processes_.request(i);
  request.mutable_node()->set_incarnation_id(NewRandomId());
  request.set_local_slot(processes_.assignment(i).local_rank());
  std::map<std::string, std::string> variables =
      LaunchedProcessVariables(options_.coordinator, request, nullptr);
  variables["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(restart);
  variables["GRADSYNC_JOB"] = options_.job;
  absl::Status started = processes_.Start(i, variables, restart, Label(i));
  if (!started.ok()) {
    GS_LOG(ERROR) << "gradsync launch: cannot restart the process of rank "
                  << processes_.assignment(i).rank() << ": "
                  << started.message();
    processes_.MarkExited(i, 1);
  }
}

void SelfManagedAgent::ReportPermanentFailure(size_t i, int exit_code,
                                              const std::string& message) {
  // The coordinator found the process lost and its peers are re-forming,
  // waiting for a replacement. The agent joins in its place, only to report
  // that it failed for good: the job fails with its exit code, and the
  // peers learn it from their heartbeat answers.
  v1::JoinRequest request = processes_.request(i);
  request.mutable_node()->set_incarnation_id(NewRandomId());
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

}  // namespace gradsync
