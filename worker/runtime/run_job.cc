#include "worker/runtime/run_job.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "worker/backend/observed_backend.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/runtime/collective_watchdog.h"
#include "worker/runtime/device.h"
#include "worker/runtime/elastic.h"
#include "worker/runtime/health_reporter.h"
#include "worker/runtime/join.h"
#include "worker/runtime/launched_process.h"
#include "worker/runtime/process_group.h"
#include "worker/runtime/reform.h"
#include "worker/runtime/telemetry.h"

namespace gradsync {
namespace {

// The user's Trainer as RunElastic's RoundTrainer: each round gets its
// telemetry (heartbeats with the loop's steps) and the coordinator's asks.
class RoundAdapter final : public RoundTrainer {
 public:
  // `device`: the process's NCCL device, once opened (null on the CPU).
  // `exact_global_batch`: the trainer runs one (JobOptions).
  RoundAdapter(Trainer* trainer, HealthReporter* reporter,
               const std::unique_ptr<NcclDevice>* device,
               const CollectiveWatchdogOptions& watchdog,
               bool exact_global_batch)
      : trainer_(trainer),
        reporter_(reporter),
        device_(device),
        watchdog_(watchdog),
        exact_global_batch_(exact_global_batch) {}

  bool has_state() const override { return trainer_->has_state(); }
  int64_t committed_step() const override { return trainer_->committed_step(); }

  absl::Status TrainRound(const v1::Assignment& assignment, Backend* backend,
                          absl::Duration process_group_time) override {
    ObservedBackend observed(backend);
    CollectiveWatchdog watchdog(&observed, watchdog_);
    std::function<int64_t()> gpu_memory;
    NcclDevice* device = device_->get();
    if (device != nullptr) {
      gpu_memory = [device] { return device->MemoryInUse(); };
    }
    Telemetry telemetry(reporter_, &observed, std::move(gpu_memory));
    Round round;
    round.number = assignment.round();
    round.rank = assignment.rank();
    round.world_size = assignment.world_size();
    round.local_rank = assignment.local_rank();
    round.node_rank = assignment.node_rank();
    round.num_nodes = assignment.num_nodes();
    round.backend_name = BackendName(assignment.backend());
    round.source_rank = assignment.source_rank();
    round.micro_batch_shares.assign(assignment.micro_batch_shares().begin(),
                                    assignment.micro_batch_shares().end());
    round.backend = &observed;
    if (device != nullptr) {
      round.device_index = device->index();
      round.device_name = device->name();
    }
    round.report_step = [&telemetry, &watchdog](const StepReport& report,
                                                int64_t samples) {
      GS_RETURN_IF_ERROR(CheckStepReport(report, samples));
      watchdog.AddStep(report.step_time, report.checkpoint);
      return telemetry.OnStep(report, samples);
    };
    round.report_fingerprint = [&telemetry](int64_t step,
                                            const ReplicaDigest& digest) {
      telemetry.OnFingerprint(step, digest);
    };
    round.await_round_over = [reporter = reporter_] {
      reporter->AwaitRoundOver();
    };
    round.report_round_start = [&telemetry, process_group_time](
                                   absl::Duration state_transfer,
                                   absl::Duration first_step) {
      telemetry.SetRoundStart(process_group_time, state_transfer, first_step);
      GS_LOG(INFO) << "round started: process group "
                   << absl::FormatDuration(process_group_time)
                   << ", state transfer " << absl::FormatDuration(state_transfer)
                   << ", first step " << absl::FormatDuration(first_step);
    };
    // A round may re-form at a step boundary to admit a node, or to move
    // an exact global batch's micro-batches between ranks.
    if (assignment.may_grow() ||
        (assignment.may_rebalance() && exact_global_batch_)) {
      round.reform_requested = [reporter = reporter_] {
        return reporter->verdict().reform_at_step_boundary;
      };
    }
    absl::Status trained = trainer_->Train(round);
    // The watchdog's reason, not the abort it caused.
    if (!trained.ok() && !watchdog.fired().ok()) trained = watchdog.fired();
    if (!trained.ok()) {
      if (!IsReformAtStepBoundary(trained)) {
        telemetry.SetError(std::string(trained.message()));
      }
      if (!IsReformAtStepBoundary(trained) && !RecoverableByRejoining(trained)) {
        ReportFailure(trained);
      }
    } else {
      telemetry.SetState(v1::WORKER_STATE_STOPPING);
    }
    trainer_->RoundEnded();
    return trained;
  }

  // Whether the job's failure was reported already (ReportFailure).
  bool reported_failure() const { return reported_failure_; }

  // Reports the failure that ends this process's part in the job, now,
  // while the round's backend still exists: RunElastic destroys it when
  // this returns, the peers see it go and re-form the round at once, and a
  // report sent after that would find the round superseded and the job
  // recovering without this rank instead of failing with its error.
  void ReportFailure(const absl::Status& trained) {
    reported_failure_ = true;
    const absl::Status reported =
        reporter_->Finish(false, EXIT_FAILURE, std::string(trained.message()));
    if (!reported.ok()) {
      GS_LOG(WARNING) << "could not report the failure: " << reported;
    }
  }

 private:
  Trainer* const trainer_;
  HealthReporter* const reporter_;
  const std::unique_ptr<NcclDevice>* const device_;
  const CollectiveWatchdogOptions watchdog_;
  const bool exact_global_batch_;
  bool reported_failure_ = false;
};

// The join request: the launcher's, or one built from `options`.
absl::StatusOr<v1::JoinRequest> MakeRequest(
    const JobOptions& options, const std::optional<LaunchedProcess>& launched,
    std::string* address, v1::DeviceType device_type, int device_count) {
  if (launched.has_value()) {
    if (launched->request.node().addresses_size() > 0) {
      *address = launched->request.node().addresses(0);
    }
    return launched->request;
  }
  JoinConfig join;
  join.job_id = options.job;
  join.nnodes = options.nnodes;
  join.nproc_per_node = options.nproc_per_node;
  join.node_id = options.node_id;
  join.backend = options.backend;
  join.failure_policy = options.failure_policy;
  join.divergence_policy = options.divergence_policy;
  join.straggler_policy = options.straggler_policy;
  join.straggler_threshold = options.straggler_threshold;
  join.join_timeout = options.join_timeout;
  join.last_call_timeout = options.last_call_timeout;
  join.address = *address;
  if (device_type != v1::DEVICE_TYPE_CPU) {
    join.device_type = device_type;
    join.device_count = device_count;
    join.nccl_available = NcclAvailable(device_type);
  }
  return BuildJoinRequest(join);
}

// On a GPU (or a simulated one): opens the process's device at its first
// assignment, the one its local rank names, and keeps it for every later
// round (the coordinator keeps the local rank, JoinRequest.local_slot).
absl::Status KeepDevice(v1::DeviceType type, int device_count,
                        const v1::Assignment& assignment,
                        std::unique_ptr<NcclDevice>* device) {
  if (type == v1::DEVICE_TYPE_CPU) return absl::OkStatus();
  const int wanted = assignment.local_rank();
  if (wanted >= device_count) {
    // Two ranks on one device would deadlock NCCL or share its memory.
    return absl::FailedPreconditionError(absl::StrCat(
        "local rank ", wanted, " has no device of its own: this process sees ",
        device_count, " device(s); run at most that many processes per node"));
  }
  if (*device == nullptr) {
    GS_ASSIGN_OR_RETURN(*device, OpenNcclDevice(type, wanted));
  } else if ((*device)->index() != wanted) {
    // The coordinator keeps a process's local rank (JoinRequest.local_slot):
    // another means another process of the round may be on this device.
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", assignment.round(), " gave this process local rank ",
        assignment.local_rank(), " (device ", wanted, "), but it trains on ",
        (*device)->name(), " since its first round and cannot move"));
  }
  GS_LOG(INFO) << "round " << assignment.round() << ": rank "
               << assignment.rank() << " on " << (*device)->name();
  return absl::OkStatus();
}

// What RunJob checks before it needs a device or the coordinator.
absl::Status CheckJobOptions(const JobOptions& options, const Trainer* trainer) {
  if (trainer == nullptr) return absl::InvalidArgumentError("RunJob needs a trainer");
  if (options.max_recoveries < 0) {
    return absl::InvalidArgumentError("max_recoveries must be >= 0");
  }
  if (options.collective_timeout_factor < 0 ||
      options.min_collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "collective_timeout_factor must be >= 0 (0: off) and "
        "min_collective_timeout positive");
  }
  return CheckDeviceType(options.device);
}

// How many devices of options.device this process may use (its own count,
// or what it sees); FAILED_PRECONDITION for an accelerator it does not see.
absl::StatusOr<int> UsableDevices(const JobOptions& options) {
  int device_count = options.device_count;
  if (device_count == 0) {
    GS_ASSIGN_OR_RETURN(device_count, VisibleDevices(options.device));
  }
  if (options.device != v1::DEVICE_TYPE_CPU && device_count < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job trains on ", DeviceTypeName(options.device),
        " but this process sees no such device"));
  }
  return device_count;
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> Connect(
    const std::string& coordinator, const JobOptions& options) {
  ClientOptions client_options;
  client_options.target = coordinator;
  client_options.tls = {options.tls_ca, options.tls_cert, options.tls_key};
  GS_ASSIGN_OR_RETURN(client_options.token, ClientToken(options.token_file));
  return GrpcCoordinatorClient::Create(client_options);
}

}  // namespace

absl::Status RunJob(const JobOptions& options, Trainer* trainer) {
  GS_RETURN_IF_ERROR(CheckJobOptions(options, trainer));
  const v1::DeviceType device_type = options.device;
  GS_ASSIGN_OR_RETURN(const int device_count, UsableDevices(options));
  GS_ASSIGN_OR_RETURN(std::optional<LaunchedProcess> launched,
                      LaunchedProcessFromEnvironment());
  const std::string coordinator =
      launched.has_value() ? launched->coordinator : options.coordinator;
  std::string address = options.address.empty()
                            ? DefaultWorkerAddress(coordinator)
                            : options.address;
  GS_ASSIGN_OR_RETURN(
      v1::JoinRequest request,
      MakeRequest(options, launched, &address, device_type, device_count));
  GS_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                      Connect(coordinator, options));

  std::unique_ptr<NcclDevice> device;  // outlives every round's backend
  ElasticOptions elastic;
  if (launched.has_value()) elastic.first_assignment = launched->assignment;
  elastic.max_recoveries = options.max_recoveries;
  elastic.keep_local_rank = device_type != v1::DEVICE_TYPE_CPU;
  ProcessGroupOptions& pg = elastic.process_group;
  pg.timeout = options.timeout;
  pg.address = address;
  pg.network_interface = options.network_interface;
  pg.shared_memory = options.shared_memory;
  pg.nccl_faults = options.nccl_faults;
  elastic.on_assignment = [&](const v1::Assignment& assignment) {
    GS_RETURN_IF_ERROR(
        KeepDevice(device_type, device_count, assignment, &device));
    pg.nccl_device = device.get();
    return absl::OkStatus();
  };

  HealthReporterOptions reporting;
  reporting.capture_stacks = options.capture_stacks;
  HealthReporter reporter(client.get(), reporting);
  CollectiveWatchdogOptions watchdog;
  watchdog.factor = options.collective_timeout_factor;
  watchdog.min = options.min_collective_timeout;
  watchdog.max = options.timeout;
  RoundAdapter adapter(trainer, &reporter, &device, watchdog,
                       options.exact_global_batch);
  absl::Status trained =
      RunElastic(client.get(), request, elastic, &reporter, &adapter);
  if (!trained.ok() && !adapter.reported_failure()) {
    adapter.ReportFailure(trained);
  }
  return trained;  // success was reported by RunElastic
}

}  // namespace gradsync
