#include "worker/launch/node_agent.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/process_usage.h"
#include "common/status_macros.h"
#include "worker/launch/gpus.h"
#include "worker/runtime/coordinator_store.h"

namespace gradsync {
namespace {

constexpr char kMasterKey[] = "master";  // "ADDRESS PORT", by node rank 0

// A TCP port free on this machine now, for rank 0's TCPStore (the same
// race torchrun accepts: the port is free when picked, not reserved).
absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t size = sizeof(address);
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0;
  const int error = errno;
  close(fd);
  if (!ok) {
    return absl::InternalError(
        absl::StrCat("cannot pick a port for MASTER_PORT: ", strerror(error)));
  }
  return ntohs(address.sin_port);
}

}  // namespace

NodeAgent::NodeAgent(LaunchOptions options, CoordinatorClient* client,
                     std::vector<std::string> environment)
    : options_(std::move(options)),
      client_(client),
      gpus_(CountGpus()),
      heartbeats_(client),
      processes_(options_, client, std::move(environment)) {}

NodeAgent::~NodeAgent() {
  inbox_.reset();  // its thread calls OnProcessMetrics
  StopProcesses();
}

void NodeAgent::CreateReporters() {
  for (size_t i = 0; i < processes_.size(); ++i) {
    const std::string incarnation =
        processes_.request(i).node().incarnation_id();
    HealthReporterOptions reporting;
    reporting.open_stream = heartbeats_.opener();
    reporting.capture_stacks = [this, incarnation](int64_t request) {
      return processes_.Stacks(incarnation, request);
    };
    reporters_[incarnation] =
        std::make_unique<HealthReporter>(client_, reporting);
  }
}

HealthReporter& NodeAgent::reporter(size_t slot) {
  return *reporters_.at(processes_.request(slot).node().incarnation_id());
}

int NodeAgent::Run() {
  absl::Status prepared = processes_.Prepare();
  if (!prepared.ok()) {
    GS_LOG(ERROR) << "gradsync launch: " << prepared.message();
    return 2;
  }
  CreateReporters();
  absl::StatusOr<std::unique_ptr<MetricsInbox>> inbox = MetricsInbox::Open(
      [this](const v1::HeartbeatRequest& m) { OnProcessMetrics(m); });
  if (inbox.ok()) {
    inbox_ = *std::move(inbox);
  } else {
    GS_LOG(WARNING) << "gradsync launch: " << inbox.status().message()
                    << "; processes cannot report their own metrics";
  }
  int64_t round = 0;
  std::string reason;  // how the process whose exit made the group rejoin ended
  for (int restart = 0;; ++restart) {
    absl::Status joined = processes_.JoinRound(round, reason);
    if (processes_.StopCode() != 0) return processes_.StopCode();
    if (!joined.ok()) {
      GS_LOG(ERROR) << "gradsync launch: cannot join job '" << options_.job
                    << "': " << joined;
      return 1;
    }
    round = processes_.assignment(0).round();
    NodeOutcome outcome = RunProcesses(restart);
    if (outcome.kind == NodeOutcome::kSucceeded) {
      outcome = ReportSuccess(round);
      if (outcome.kind == NodeOutcome::kSucceeded) return 0;
    }
    if (outcome.kind == NodeOutcome::kStopped) {
      const std::string why =
          absl::StrCat("stopped by signal ", outcome.exit_code - 128);
      for (auto& [incarnation, reporter] : reporters_) {
        reporter->Finish(false, outcome.exit_code, why).IgnoreError();
      }
      return outcome.exit_code;
    }
    if (std::optional<int> code = GiveUp(outcome, restart, round)) {
      return *code;
    }
    reason = outcome.kind == NodeOutcome::kFailed
                 ? processes_.Describe(outcome, round)
                 : "";
  }
}

NodeOutcome NodeAgent::RunProcesses(int restart) {
  absl::StatusOr<AgentContext> context = ExchangeMaster(restart);
  if (processes_.StopCode() != 0) {
    // Stopped before any process started: the members report it (Run) in
    // the round they joined.
    for (size_t i = 0; i < processes_.size(); ++i) {
      reporter(i).Start(processes_.assignment(i),
                        processes_.request(i).node().incarnation_id());
    }
    return NodeOutcome{NodeOutcome::kStopped, -1, processes_.StopCode(), {}};
  }
  absl::Status started =
      context.ok() ? StartProcesses(*context) : context.status();
  // ABORTED: the round was superseded before this node's processes started
  // (a process of another node failed first): rejoin with the others, as
  // after a round that ended while the processes ran.
  const NodeOutcome outcome =
      started.ok() ? Supervise()
                   : NodeOutcome{absl::IsAborted(started)
                                     ? NodeOutcome::kRoundOver
                                     : NodeOutcome::kError,
                                 -1, 1, started};
  StopProcesses();
  return outcome;
}

NodeOutcome NodeAgent::ReportSuccess(int64_t round) {
  for (size_t i = 0; i < processes_.size(); ++i) {
    absl::Status reported = reporter(i).Finish(true, 0, "");
    if (absl::IsAborted(reported)) {  // superseded just then
      return NodeOutcome{NodeOutcome::kRoundOver, -1, 1, reported};
    }
    if (!reported.ok()) {
      return NodeOutcome{
          NodeOutcome::kError, -1, 1,
          absl::Status(reported.code(),
                       absl::StrCat("rank ", processes_.assignment(i).rank(),
                                    " succeeded, but the coordinator did not "
                                    "record it: ",
                                    reported.message()))};
    }
  }
  return AwaitJobEnd(round);
}

NodeOutcome NodeAgent::AwaitJobEnd(int64_t round) {
  // Like torchrun's exit barrier: the node's processes are done, but a
  // process of another node may still fail and restart the group, this
  // node's too. Wait for the job to end or the round to be superseded.
  while (true) {
    absl::StatusOr<v1::JobStatus> job = client_->GetJob(options_.job);
    if (job.ok()) {
      if (job->state() == v1::JOB_STATE_SUCCEEDED) return NodeOutcome{};
      if (job->state() == v1::JOB_STATE_FAILED) {
        return NodeOutcome{NodeOutcome::kJobFailed, -1, 1,
                           absl::FailedPreconditionError(absl::StrCat(
                               "the job failed: ", job->reason()))};
      }
      if (job->round() > round || job->state() == v1::JOB_STATE_WAITING) {
        return NodeOutcome{NodeOutcome::kRoundOver, -1, 1,
                           absl::AbortedError("another node's process failed "
                                              "after this node's succeeded")};
      }
    }
    if (processes_.AwaitStop(options_.monitor_interval)) {
      return NodeOutcome{NodeOutcome::kStopped, -1, processes_.StopCode(), {}};
    }
  }
}

std::optional<int> NodeAgent::GiveUp(const NodeOutcome& outcome, int restart,
                                     int64_t round) {
  const std::string what = processes_.Describe(outcome, round);
  const bool restartable = outcome.kind == NodeOutcome::kFailed ||
                           outcome.kind == NodeOutcome::kRoundOver;
  if (restartable && restart < options_.max_restarts) {
    GS_LOG(WARNING) << "gradsync launch: " << what
                    << "; restarting the group (restart " << restart + 1
                    << " of " << options_.max_restarts << ")";
    for (auto& [incarnation, reporter] : reporters_) reporter->Stop();
    return std::nullopt;
  }
  GS_LOG(ERROR) << "gradsync launch: " << what
                << (restartable
                        ? absl::StrCat("; no restarts left (--max_restarts=",
                                       options_.max_restarts, ")")
                        : "");
  for (size_t i = 0; i < processes_.size(); ++i) {
    const bool failed = outcome.kind == NodeOutcome::kError ||
                        (outcome.kind == NodeOutcome::kFailed &&
                         static_cast<int>(i) == outcome.slot);
    if (failed) {
      reporter(i).Finish(false, outcome.exit_code, what).IgnoreError();
    } else {
      reporter(i).Stop();
    }
  }
  return outcome.kind == NodeOutcome::kFailed ? outcome.exit_code : 1;
}

absl::StatusOr<AgentContext> NodeAgent::ExchangeMaster(int restart) {
  const v1::Assignment& first = processes_.assignment(0);
  v1::Scope scope;
  scope.set_job_id(first.job_id());
  scope.set_round(first.round());
  CoordinatorStore store(client_, scope, "launch/");
  AgentContext context;
  context.role = options_.role;
  context.coordinator = options_.coordinator;
  context.restart_count = restart;
  context.max_restarts = options_.max_restarts;
  if (inbox_ != nullptr) {
    context.agent_socket = inbox_->path();
    context.stacks_dir = inbox_->dir();
  }
  if (first.node_rank() == 0) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    context.master_addr = processes_.request(0).node().addresses(0);
    context.master_port = *port;
    absl::Status set = store.Set(
        kMasterKey, absl::StrCat(context.master_addr, " ", context.master_port));
    if (!set.ok()) return set;
    return context;
  }
  absl::StatusOr<std::string> master = AwaitMaster(&store);
  if (!master.ok()) return master.status();
  std::pair<std::string, std::string> parts = absl::StrSplit(*master, ' ');
  context.master_addr = parts.first;
  if (!absl::SimpleAtoi(parts.second, &context.master_port)) {
    return absl::DataLossError(
        absl::StrCat("node rank 0 published a bad master '", *master, "'"));
  }
  return context;
}

absl::StatusOr<std::string> NodeAgent::AwaitMaster(Store* store) {
  // In slices, so that a stop (SIGTERM while node rank 0 is still coming)
  // ends the wait within one.
  constexpr absl::Duration kSlice = absl::Seconds(1);
  const absl::Time deadline = absl::Now() + options_.join_timeout;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left < absl::Milliseconds(1)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "node rank 0 did not publish the master address within ",
          absl::FormatDuration(options_.join_timeout), " (--join_timeout)"));
    }
    absl::StatusOr<std::string> master =
        store->Get(kMasterKey, std::min(kSlice, left));
    if (!absl::IsDeadlineExceeded(master.status())) return master;
    if (processes_.StopCode() != 0) {
      return absl::CancelledError("stopped while waiting for node rank 0");
    }
  }
}

absl::Status NodeAgent::StartProcesses(const AgentContext& context) {
  processes_.ResetAttempt();
  {
    absl::MutexLock lock(&mu_);
    running_round_ = processes_.assignment(0).round();
    reported_.clear();
    for (size_t i = 0; i < processes_.size(); ++i) {
      reported_[processes_.assignment(i).rank()] =
          Reported{&reporter(i), {}, 0};
    }
  }
  for (size_t i = 0; i < processes_.size(); ++i) {
    const v1::Assignment& assignment = processes_.assignment(i);
    reporter(i).Start(assignment, processes_.request(i).node().incarnation_id(),
                      [this](const absl::Status& why) {
                        processes_.Interrupt(why);
                      });
    GS_RETURN_IF_ERROR(processes_.Start(
        i, TorchrunVariables(assignment, context), context.restart_count,
        absl::StrCat("rank", assignment.rank())));
    absl::MutexLock lock(&mu_);
    reported_[assignment.rank()].pid = processes_.process(i)->pid();
  }
  ReportMetrics();
  return absl::OkStatus();
}

std::map<pid_t, int64_t> NodeAgent::GpuMemory() {
  // nvidia-smi hung once (a GPU off the bus): the agent's supervision does
  // not wait for it again for a while.
  constexpr absl::Duration kQueryTimeout = absl::Seconds(2);
  constexpr absl::Duration kPauseAfterTimeout = absl::Minutes(1);
  if (gpus_ == 0 || absl::Now() < gpu_query_paused_until_) return {};
  absl::StatusOr<std::map<pid_t, int64_t>> memory =
      GpuMemoryByPid(ComputeAppsCommand(), kQueryTimeout);
  if (memory.ok()) return *std::move(memory);
  GS_LOG(WARNING) << "gradsync launch: " << memory.status().message()
                  << "; GPU memory is not reported for "
                  << absl::FormatDuration(kPauseAfterTimeout);
  gpu_query_paused_until_ = absl::Now() + kPauseAfterTimeout;
  return {};
}

void NodeAgent::ReportMetrics() {
  const std::map<pid_t, int64_t> gpu_memory = GpuMemory();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < processes_.size(); ++i) {
    const LocalProcess* process = processes_.process(i);
    if (process == nullptr) continue;
    auto reported = reported_.find(processes_.assignment(i).rank());
    if (reported == reported_.end()) continue;
    v1::WorkerMetrics metrics = reported->second.metrics;
    if (std::optional<int> exit_code = processes_.exit_code(i)) {
      metrics.set_state(v1::WORKER_STATE_STOPPING);
      if (*exit_code != 0) {
        metrics.set_last_error(absl::StrCat("exited with code ", *exit_code));
      }
    } else {
      reported->second.rss_bytes = ResidentBytes(process->pid());
      reported->second.cpu_seconds = CpuSeconds(process->pid());
      auto gpu = gpu_memory.find(process->pid());
      reported->second.gpu_memory_bytes =
          gpu == gpu_memory.end() ? 0 : gpu->second;
      if (metrics.state() == v1::WORKER_STATE_UNSPECIFIED) {
        metrics.set_state(v1::WORKER_STATE_TRAINING);
      }
    }
    metrics.set_rss_bytes(reported->second.rss_bytes);
    metrics.set_cpu_seconds(reported->second.cpu_seconds);
    metrics.set_pid(reported->second.pid);
    if (metrics.gpu_memory_bytes() == 0) {  // unless the process said
      metrics.set_gpu_memory_bytes(reported->second.gpu_memory_bytes);
    }
    // Under mu_, so that no report of an ended attempt reaches the reporter
    // once it moved to the next round (it takes no lock of ours).
    reported->second.reporter->Update(metrics);
  }
}

void NodeAgent::OnProcessMetrics(const v1::HeartbeatRequest& message) {
  absl::MutexLock lock(&mu_);
  auto reported = reported_.find(message.member().rank());
  if (message.member().round() != running_round_ ||
      reported == reported_.end()) {
    return;  // a process of an ended attempt, or not one of ours
  }
  v1::WorkerMetrics metrics = message.metrics();
  metrics.set_rss_bytes(reported->second.rss_bytes);
  metrics.set_cpu_seconds(reported->second.cpu_seconds);
  metrics.set_pid(reported->second.pid);
  if (metrics.state() == v1::WORKER_STATE_UNSPECIFIED) {
    metrics.set_state(v1::WORKER_STATE_TRAINING);
  }
  reported->second.reporter->Update(metrics);
  metrics.clear_recent_collectives();  // events go out once
  metrics.clear_first_bucket_ready();
  reported->second.metrics = std::move(metrics);
}

NodeOutcome NodeAgent::Supervise() {
  while (true) {
    std::optional<NodeOutcome> outcome =
        processes_.Await(options_.monitor_interval);
    ReportMetrics();
    if (outcome.has_value()) return *outcome;
  }
}

void NodeAgent::StopProcesses() {
  processes_.StopAll();
  absl::MutexLock lock(&mu_);
  running_round_ = 0;
  reported_.clear();
}

}  // namespace gradsync
