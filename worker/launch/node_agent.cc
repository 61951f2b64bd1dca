#include "worker/launch/node_agent.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/process_usage.h"
#include "worker/launch/gpus.h"
#include "worker/launch/process_stacks.h"
#include "worker/runtime/coordinator_store.h"
#include "worker/runtime/join.h"

namespace gradsync {
namespace {

constexpr char kMasterKey[] = "master";  // "ADDRESS PORT", by node rank 0
// How long the output of exited processes may take to arrive.
constexpr absl::Duration kOutputDrain = absl::Seconds(5);

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

absl::Status MakeDirectories(const std::string& path) {
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    absl::StrAppend(&prefix, part, "/");
    if (part.empty()) continue;
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", prefix, ": ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

NodeAgent::NodeAgent(LaunchOptions options, CoordinatorClient* client,
                     std::vector<std::string> environment)
    : options_(std::move(options)),
      client_(client),
      environment_(std::move(environment)),
      gpus_(CountGpus()),
      heartbeats_(client) {}

NodeAgent::~NodeAgent() {
  inbox_.reset();  // its thread calls OnProcessMetrics
  StopProcesses();
}

void NodeAgent::RequestStop(int signal) {
  std::vector<std::string> joining;
  {
    absl::MutexLock lock(&mu_);
    if (stop_signal_ == 0) stop_signal_ = signal;
    if (joining_) {
      for (const Slot& slot : slots_) {
        joining.push_back(slot.request.node().incarnation_id());
      }
    }
  }
  // A join waits for the round: leaving ends it (CANCELLED).
  for (const std::string& incarnation : joining) {
    client_->Leave(options_.job, incarnation).IgnoreError();
  }
}

int NodeAgent::StopCode() const {
  absl::MutexLock lock(&mu_);
  return stop_signal_ == 0 ? 0 : 128 + stop_signal_;
}

std::string NodeAgent::Describe(const Outcome& outcome,
                                int64_t round) const {
  switch (outcome.kind) {
    case Outcome::kFailed:
      return absl::StrCat("rank ", slots_[outcome.slot].assignment.rank(),
                          " (pid ", outcome.pid, ") ",
                          ExitText(outcome.exit_code));
    case Outcome::kRoundOver:
    case Outcome::kJobFailed:
      return absl::StrCat("the coordinator ended round ", round, ": ",
                          outcome.status.message());
    default:
      return std::string(outcome.status.message());
  }
}

absl::Status NodeAgent::PrepareSlots() {
  JoinConfig config;
  config.job_id = options_.job;
  config.nnodes = options_.nnodes;
  config.nproc_per_node = options_.nproc_per_node;
  config.node_id = options_.node_id;
  config.backend = options_.backend;
  config.join_timeout = options_.join_timeout;
  config.address = options_.address.empty()
                       ? DefaultWorkerAddress(options_.coordinator)
                       : options_.address;
  if (gpus_ > 0) {  // what the round's backend negotiation sees
    config.device_type = v1::DEVICE_TYPE_CUDA;
    config.device_count = gpus_;
    config.nccl_available = NcclLoadable();
  }
  for (int i = 0; i < options_.nproc_per_node; ++i) {
    absl::StatusOr<v1::JoinRequest> request = BuildJoinRequest(config);
    if (!request.ok()) return request.status();
    Slot slot;
    slot.request = *std::move(request);
    HealthReporterOptions reporting;
    reporting.open_stream = heartbeats_.opener();
    reporting.capture_stacks = [this, i](int64_t request) {
      return SlotStacks(static_cast<size_t>(i), request);
    };
    slot.reporter = std::make_unique<HealthReporter>(client_, reporting);
    slots_.push_back(std::move(slot));
  }
  absl::MutexLock lock(&mu_);
  stack_targets_.resize(slots_.size());
  return absl::OkStatus();
}

v1::ThreadStacks NodeAgent::SlotStacks(size_t i, int64_t request) const {
  StackTarget target;
  {
    absl::MutexLock lock(&mu_);
    target = stack_targets_[i];
  }
  if (target.pid == 0) {
    v1::ThreadStacks none;
    none.set_request(request);
    none.set_error("no process is running");
    return none;
  }
  return CaptureProcessStacks(request, target.pid, target.file);
}

int NodeAgent::Run() {
  absl::Status prepared = PrepareSlots();
  if (!prepared.ok()) {
    GS_LOG(ERROR) << "gradsync launch: " << prepared.message();
    return 2;
  }
  if (options_.self_managed) return RunSelfManaged();
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
    absl::Status joined = JoinRound(round, reason);
    if (StopCode() != 0) return StopCode();
    if (!joined.ok()) {
      GS_LOG(ERROR) << "gradsync launch: cannot join job '" << options_.job
                    << "': " << joined;
      return 1;
    }
    round = slots_[0].assignment.round();
    Outcome outcome = RunProcesses(restart);
    if (outcome.kind == Outcome::kSucceeded) {
      outcome = ReportSuccess(round);
      if (outcome.kind == Outcome::kSucceeded) return 0;
    }
    if (outcome.kind == Outcome::kStopped) {
      const std::string why =
          absl::StrCat("stopped by signal ", outcome.exit_code - 128);
      for (Slot& slot : slots_) {
        slot.reporter->Finish(false, outcome.exit_code, why).IgnoreError();
      }
      return outcome.exit_code;
    }
    if (std::optional<int> code = GiveUp(outcome, restart, round)) {
      return *code;
    }
    reason = outcome.kind == Outcome::kFailed ? Describe(outcome, round) : "";
  }
}

NodeAgent::Outcome NodeAgent::RunProcesses(int restart) {
  absl::StatusOr<AgentContext> context = ExchangeMaster(restart);
  absl::Status started =
      context.ok() ? StartProcesses(*context) : context.status();
  const Outcome outcome =
      started.ok() ? Supervise() : Outcome{Outcome::kError, -1, 1, started};
  StopProcesses();
  return outcome;
}

NodeAgent::Outcome NodeAgent::ReportSuccess(int64_t round) {
  for (Slot& slot : slots_) {
    absl::Status reported = slot.reporter->Finish(true, 0, "");
    if (absl::IsAborted(reported)) {  // superseded just then
      return Outcome{Outcome::kRoundOver, -1, 1, reported};
    }
    if (!reported.ok()) {
      return Outcome{Outcome::kError, -1, 1,
                     absl::Status(reported.code(),
                                  absl::StrCat("rank ", slot.assignment.rank(),
                                               " succeeded, but the "
                                               "coordinator did not record "
                                               "it: ", reported.message()))};
    }
  }
  // Like torchrun's exit barrier: the node's processes are done, but a
  // process of another node may still fail and restart the group, this
  // node's too. Wait for the job to end or the round to be superseded.
  while (true) {
    absl::StatusOr<v1::JobStatus> job = client_->GetJob(options_.job);
    if (job.ok()) {
      if (job->state() == v1::JOB_STATE_SUCCEEDED) return Outcome{};
      if (job->state() == v1::JOB_STATE_FAILED) {
        return Outcome{Outcome::kJobFailed, -1, 1,
                       absl::FailedPreconditionError(
                           absl::StrCat("the job failed: ", job->reason()))};
      }
      if (job->round() > round || job->state() == v1::JOB_STATE_WAITING) {
        return Outcome{Outcome::kRoundOver, -1, 1,
                       absl::AbortedError("another node's process failed "
                                          "after this node's succeeded")};
      }
    }
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_signal_ != 0;
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping),
                             options_.monitor_interval)) {
      return Outcome{Outcome::kStopped, -1, 128 + stop_signal_, {}};
    }
  }
}

std::optional<int> NodeAgent::GiveUp(const Outcome& outcome, int restart,
                                     int64_t round) {
  const std::string what = Describe(outcome, round);
  const bool restartable =
      outcome.kind == Outcome::kFailed || outcome.kind == Outcome::kRoundOver;
  if (restartable && restart < options_.max_restarts) {
    GS_LOG(WARNING) << "gradsync launch: " << what
                    << "; restarting the group (restart " << restart + 1
                    << " of " << options_.max_restarts << ")";
    for (Slot& slot : slots_) slot.reporter->Stop();
    return std::nullopt;
  }
  GS_LOG(ERROR) << "gradsync launch: " << what
                << (restartable
                        ? absl::StrCat("; no restarts left (--max_restarts=",
                                       options_.max_restarts, ")")
                        : "");
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    const bool failed =
        outcome.kind == Outcome::kError ||
        (outcome.kind == Outcome::kFailed && i == outcome.slot);
    if (failed) {
      slots_[i].reporter->Finish(false, outcome.exit_code, what).IgnoreError();
    } else {
      slots_[i].reporter->Stop();
    }
  }
  return outcome.kind == Outcome::kFailed ? outcome.exit_code : 1;
}

absl::Status NodeAgent::JoinRound(int64_t last_round,
                                  const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_signal_ != 0) return absl::CancelledError("stopped");
    joining_ = true;
  }
  // One call for the node's processes (Rendezvous.JoinNode).
  v1::JoinNodeRequest request;
  request.set_job_id(slots_[0].request.job_id());
  *request.mutable_config() = slots_[0].request.config();
  request.set_rejoin_reason(reason);
  for (const Slot& slot : slots_) {
    v1::ProcessJoin* process = request.add_processes();
    *process->mutable_node() = slot.request.node();
    process->set_last_round(last_round);
  }
  absl::StatusOr<std::vector<v1::Assignment>> assignments =
      client_->JoinNode(request);
  {
    absl::MutexLock lock(&mu_);
    joining_ = false;
  }
  if (!assignments.ok()) return assignments.status();
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].assignment = std::move((*assignments)[i]);
  }
  // Slot order is local-rank order from here on.
  std::sort(slots_.begin(), slots_.end(), [](const Slot& a, const Slot& b) {
    return a.assignment.local_rank() < b.assignment.local_rank();
  });
  const v1::Assignment& first = slots_[0].assignment;
  GS_LOG(INFO) << "gradsync launch: job '" << first.job_id() << "' round "
               << first.round() << ": node rank " << first.node_rank() << " of "
               << first.num_nodes() << ", ranks " << first.rank() << "-"
               << first.rank() + static_cast<int>(slots_.size()) - 1 << " of "
               << first.world_size();
  return absl::OkStatus();
}

absl::StatusOr<AgentContext> NodeAgent::ExchangeMaster(int restart) {
  const v1::Assignment& first = slots_[0].assignment;
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
    context.master_addr = slots_[0].request.node().addresses(0);
    context.master_port = *port;
    absl::Status set = store.Set(
        kMasterKey, absl::StrCat(context.master_addr, " ", context.master_port));
    if (!set.ok()) return set;
    return context;
  }
  absl::StatusOr<std::string> master =
      store.Get(kMasterKey, options_.join_timeout);
  if (!master.ok()) return master.status();
  std::pair<std::string, std::string> parts = absl::StrSplit(*master, ' ');
  context.master_addr = parts.first;
  if (!absl::SimpleAtoi(parts.second, &context.master_port)) {
    return absl::DataLossError(
        absl::StrCat("node rank 0 published a bad master '", *master, "'"));
  }
  return context;
}

OutputSink NodeAgent::SinkFor(const std::string& label, int local_rank,
                              int restart, int stream) const {
  OutputSink sink;
  sink.prefix = absl::StrCat("[", label, "]: ");
  const bool to_file = !options_.log_dir.empty() &&
                       (options_.redirects.Includes(local_rank, stream) ||
                        options_.tee.Includes(local_rank, stream));
  const bool console_only_off = !options_.log_dir.empty() &&
                                options_.redirects.Includes(local_rank, stream) &&
                                !options_.tee.Includes(local_rank, stream);
  sink.console_fd =
      console_only_off ? -1 : (stream == 1 ? STDOUT_FILENO : STDERR_FILENO);
  if (to_file) {
    const std::string dir =
        absl::StrCat(options_.log_dir, "/attempt_", restart, "/", label);
    absl::Status made = MakeDirectories(dir);
    const std::string path =
        absl::StrCat(dir, stream == 1 ? "/stdout.log" : "/stderr.log");
    sink.file_fd =
        made.ok() ? open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                         0644)
                  : -1;
    if (sink.file_fd < 0) {
      GS_LOG(WARNING) << "gradsync launch: cannot write " << path
                      << (made.ok() ? absl::StrCat(": ", strerror(errno))
                                    : absl::StrCat(": ", made.message()));
    }
  }
  return sink;
}

absl::Status NodeAgent::StartProcesses(const AgentContext& context) {
  {
    absl::MutexLock lock(&mu_);
    exits_.assign(slots_.size(), std::nullopt);
    round_over_.reset();
    running_round_ = slots_[0].assignment.round();
    reported_.clear();
    for (Slot& slot : slots_) {
      reported_[slot.assignment.rank()] = Reported{slot.reporter.get(), {}, 0};
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    slot.reporter->Start(
        slot.assignment, slot.request.node().incarnation_id(),
        [this](const absl::Status& why) {
          absl::MutexLock lock(&mu_);
          if (!round_over_.has_value()) round_over_ = why;
        });
    absl::Status started = StartProcess(
        i, TorchrunVariables(slot.assignment, context), context.restart_count);
    if (!started.ok()) return started;
  }
  ReportMetrics();
  return absl::OkStatus();
}

absl::Status NodeAgent::StartProcess(
    size_t i, const std::map<std::string, std::string>& variables,
    int restart) {
  Slot& slot = slots_[i];
  // A process registers for stacks in a file of its own, empty at its start.
  const auto stacks = variables.find("GRADSYNC_STACKS_FILE");
  const std::string stacks_file =
      stacks == variables.end() ? "" : stacks->second;
  if (!stacks_file.empty()) {
    const int fd = open(stacks_file.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
  }
  absl::StatusOr<std::unique_ptr<LocalProcess>> process = LocalProcess::Start(
      options_.command, MergeEnvironment(environment_, variables));
  if (!process.ok()) return process.status();
  slot.process = *std::move(process);
  {
    absl::MutexLock lock(&mu_);
    stack_targets_[i] = StackTarget{slot.process->pid(), stacks_file};
    auto reported = reported_.find(slot.assignment.rank());
    if (reported != reported_.end()) reported->second.pid = slot.process->pid();
  }
  // Self-managed processes change ranks as they re-form: their output is
  // labelled by the local slot instead.
  const std::string label =
      options_.self_managed ? absl::StrCat("local", i)
                            : absl::StrCat("rank", slot.assignment.rank());
  const int local_rank = static_cast<int>(i);
  output_.Add(slot.process->TakeStdout(), SinkFor(label, local_rank, restart, 1));
  output_.Add(slot.process->TakeStderr(), SinkFor(label, local_rank, restart, 2));
  slot.reaper = std::thread([this, i, process = slot.process.get()] {
    const int code = process->Wait();
    absl::MutexLock lock(&mu_);
    exits_[i] = code;
    stack_targets_[i].pid = 0;  // reaped: the pid may be reused
  });
  return absl::OkStatus();
}

void NodeAgent::ReportMetrics() {
  const std::map<pid_t, int64_t> gpu_memory =
      gpus_ > 0 ? GpuMemoryByPid() : std::map<pid_t, int64_t>();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].process == nullptr) continue;
    auto reported = reported_.find(slots_[i].assignment.rank());
    if (reported == reported_.end()) continue;
    v1::WorkerMetrics metrics = reported->second.metrics;
    if (exits_[i].has_value()) {
      metrics.set_state(v1::WORKER_STATE_STOPPING);
      if (*exits_[i] != 0) {
        metrics.set_last_error(absl::StrCat("exited with code ", *exits_[i]));
      }
    } else {
      reported->second.rss_bytes = ResidentBytes(slots_[i].process->pid());
      reported->second.cpu_seconds = CpuSeconds(slots_[i].process->pid());
      auto gpu = gpu_memory.find(slots_[i].process->pid());
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

NodeAgent::Outcome NodeAgent::Supervise() {
  while (true) {
    std::optional<Outcome> outcome;
    {
      absl::MutexLock lock(&mu_);
      auto decided = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stop_signal_ != 0 || round_over_.has_value()) return true;
        bool all = true;
        for (const std::optional<int>& code : exits_) {
          if (code.has_value() && *code != 0) return true;
          all = all && code.has_value();
        }
        return all;
      };
      if (mu_.AwaitWithTimeout(absl::Condition(&decided),
                               options_.monitor_interval)) {
        if (stop_signal_ != 0) {
          outcome = Outcome{Outcome::kStopped, -1, 128 + stop_signal_, {}};
        } else {
          for (size_t i = 0; i < exits_.size() && !outcome; ++i) {
            if (exits_[i].has_value() && *exits_[i] != 0) {
              outcome = Outcome{Outcome::kFailed, static_cast<int>(i),
                                *exits_[i], {}, slots_[i].process->pid()};
            }
          }
          if (!outcome && round_over_.has_value()) {
            outcome = Outcome{absl::IsFailedPrecondition(*round_over_)
                                  ? Outcome::kJobFailed
                                  : Outcome::kRoundOver,
                              -1, 1, *round_over_};
          }
          if (!outcome) outcome = Outcome{Outcome::kSucceeded, -1, 0, {}};
        }
      }
    }
    ReportMetrics();
    if (outcome.has_value()) return *outcome;
  }
}

void NodeAgent::StopProcesses() {
  for (Slot& slot : slots_) {
    if (slot.process != nullptr) slot.process->Signal(SIGTERM);
  }
  {
    absl::MutexLock lock(&mu_);
    auto all_exited = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (size_t i = 0; i < exits_.size(); ++i) {
        if (slots_[i].process != nullptr && !exits_[i].has_value()) {
          return false;
        }
      }
      return true;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all_exited),
                              options_.stop_timeout)) {
      GS_LOG(WARNING) << "gradsync launch: processes still running "
                      << options_.stop_timeout << " after SIGTERM: SIGKILL";
    }
  }
  for (Slot& slot : slots_) {
    if (slot.process != nullptr) slot.process->Signal(SIGKILL);
  }
  for (Slot& slot : slots_) {
    if (slot.reaper.joinable()) slot.reaper.join();
  }
  output_.Drain(kOutputDrain);
  {
    absl::MutexLock lock(&mu_);
    running_round_ = 0;
    reported_.clear();
  }
  for (Slot& slot : slots_) slot.process.reset();
}

}  // namespace gradsync
