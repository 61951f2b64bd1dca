#include "worker/launch/node_processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/backend/sim_device.h"
#include "worker/launch/gpus.h"
#include "worker/launch/process_stacks.h"
#include "worker/launch/torchrun_env.h"
#include "worker/runtime/join.h"

namespace gradsync {
namespace {

// How long the output of exited processes may take to arrive.
constexpr absl::Duration kOutputDrain = absl::Seconds(5);

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

// Sets what the round's backend negotiation sees of this node's devices.
absl::Status OfferDevices(LaunchDevice device, JoinConfig* config) {
  switch (device) {
    case LaunchDevice::kCpu:
      return absl::OkStatus();
    case LaunchDevice::kSim: {
      GS_ASSIGN_OR_RETURN(config->device_count, SimDeviceCount());
      config->device_type = v1::DEVICE_TYPE_SIM;
      config->nccl_available = true;  // the simulated NCCL is built in
      return absl::OkStatus();
    }
    case LaunchDevice::kAuto:
      break;
  }
  const int gpus = CountGpus();
  if (gpus > 0) {
    config->device_type = v1::DEVICE_TYPE_CUDA;
    config->device_count = gpus;
    config->nccl_available = NcclLoadable();
  }
  return absl::OkStatus();
}

}  // namespace

NodeProcesses::NodeProcesses(const LaunchOptions& options,
                             CoordinatorClient* client,
                             std::vector<std::string> environment)
    : options_(options), client_(client), environment_(std::move(environment)) {}

NodeProcesses::~NodeProcesses() { StopAll(); }

absl::Status NodeProcesses::Prepare() {
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
  GS_RETURN_IF_ERROR(OfferDevices(options_.device, &config));
  for (int i = 0; i < options_.nproc_per_node; ++i) {
    absl::StatusOr<v1::JoinRequest> request = BuildJoinRequest(config);
    if (!request.ok()) return request.status();
    Slot slot;
    slot.request = *std::move(request);
    slots_.push_back(std::move(slot));
  }
  absl::MutexLock lock(&mu_);
  exits_.assign(slots_.size(), std::nullopt);
  return absl::OkStatus();
}

absl::Status NodeProcesses::JoinRound(int64_t last_round,
                                      const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_signal_ != 0) return absl::CancelledError("stopped");
    joining_ = true;
  }
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
    if (stop_signal_ != 0) return absl::CancelledError("stopped");
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

OutputSink NodeProcesses::SinkFor(const std::string& label, int local_rank,
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

absl::Status NodeProcesses::Start(
    size_t i, const std::map<std::string, std::string>& variables, int restart,
    const std::string& label) {
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
      options_.command,
      MergeEnvironment(environment_, variables, options_.nproc_per_node));
  if (!process.ok()) return process.status();
  slot.process = *std::move(process);
  const std::string incarnation = slot.request.node().incarnation_id();
  {
    absl::MutexLock lock(&mu_);
    exits_[i].reset();
    stack_targets_[incarnation] = StackTarget{slot.process->pid(), stacks_file};
  }
  const int local_rank = static_cast<int>(i);
  output_.Add(slot.process->TakeStdout(), SinkFor(label, local_rank, restart, 1));
  output_.Add(slot.process->TakeStderr(), SinkFor(label, local_rank, restart, 2));
  slot.reaper = std::thread([this, i, incarnation, stacks_file,
                             process = slot.process.get()] {
    const int code = process->Wait();
    {
      absl::MutexLock lock(&mu_);
      exits_[i] = code;
      stack_targets_.erase(incarnation);  // reaped: the pid may be reused
    }
    // Made by Start for this process only (the next attempt makes its own).
    if (!stacks_file.empty()) unlink(stacks_file.c_str());
  });
  return absl::OkStatus();
}

std::optional<NodeOutcome> NodeProcesses::DecidedLocked() const {
  if (stop_signal_ != 0) {
    return NodeOutcome{NodeOutcome::kStopped, -1, 128 + stop_signal_, {}};
  }
  for (size_t i = 0; i < exits_.size(); ++i) {
    if (exits_[i].has_value() && *exits_[i] != 0) {
      const LocalProcess* process = slots_[i].process.get();
      return NodeOutcome{NodeOutcome::kFailed, static_cast<int>(i), *exits_[i],
                         {}, process == nullptr ? 0 : process->pid()};
    }
  }
  if (interrupted_.has_value()) {
    return NodeOutcome{absl::IsFailedPrecondition(*interrupted_)
                           ? NodeOutcome::kJobFailed
                           : NodeOutcome::kRoundOver,
                       -1, 1, *interrupted_};
  }
  for (const std::optional<int>& code : exits_) {
    if (!code.has_value()) return std::nullopt;
  }
  return NodeOutcome{NodeOutcome::kSucceeded, -1, 0, {}};
}

std::optional<NodeOutcome> NodeProcesses::Await(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto decided = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return DecidedLocked().has_value();
  };
  mu_.AwaitWithTimeout(absl::Condition(&decided), timeout);
  return DecidedLocked();
}

void NodeProcesses::Interrupt(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (!interrupted_.has_value()) interrupted_ = why;
}

void NodeProcesses::ResetAttempt() {
  absl::MutexLock lock(&mu_);
  exits_.assign(slots_.size(), std::nullopt);
  interrupted_.reset();
}

std::optional<int> NodeProcesses::exit_code(size_t i) const {
  absl::MutexLock lock(&mu_);
  return exits_[i];
}

void NodeProcesses::StopAll() {
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
  for (Slot& slot : slots_) slot.process.reset();
}

void NodeProcesses::Reap(size_t i) {
  Slot& slot = slots_[i];
  if (slot.reaper.joinable()) slot.reaper.join();
  slot.process.reset();
  absl::MutexLock lock(&mu_);
  exits_[i].reset();
}

void NodeProcesses::MarkExited(size_t i, int code) {
  absl::MutexLock lock(&mu_);
  exits_[i] = code;
}

void NodeProcesses::RequestStop(int signal) {
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

bool NodeProcesses::AwaitStop(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_signal_ != 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&stopping), timeout);
}

int NodeProcesses::StopCode() const {
  absl::MutexLock lock(&mu_);
  return stop_signal_ == 0 ? 0 : 128 + stop_signal_;
}

v1::ThreadStacks NodeProcesses::Stacks(const std::string& incarnation_id,
                                       int64_t request) const {
  StackTarget target;
  {
    absl::MutexLock lock(&mu_);
    auto found = stack_targets_.find(incarnation_id);
    if (found != stack_targets_.end()) target = found->second;
  }
  if (target.pid == 0) {
    v1::ThreadStacks none;
    none.set_request(request);
    none.set_error("no process is running");
    return none;
  }
  return CaptureProcessStacks(request, target.pid, target.file);
}

std::string NodeProcesses::Describe(const NodeOutcome& outcome,
                                    int64_t round) const {
  switch (outcome.kind) {
    case NodeOutcome::kFailed:
      return absl::StrCat("rank ", slots_[outcome.slot].assignment.rank(),
                          " (pid ", outcome.pid, ") ",
                          ExitText(outcome.exit_code));
    case NodeOutcome::kRoundOver:
    case NodeOutcome::kJobFailed:
      return absl::StrCat("the coordinator ended round ", round, ": ",
                          outcome.status.message());
    default:
      return std::string(outcome.status.message());
  }
}

}  // namespace gradsync
