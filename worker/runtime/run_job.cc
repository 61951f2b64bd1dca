#include "worker/runtime/run_job.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <utility>

#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "worker/backend/observed_backend.h"
#include "worker/client/coordinator_client.h"
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
  RoundAdapter(Trainer* trainer, HealthReporter* reporter, bool cuda,
               const int* cuda_device)
      : trainer_(trainer),
        reporter_(reporter),
        cuda_(cuda),
        cuda_device_(cuda_device) {}

  bool has_state() const override { return trainer_->has_state(); }
  int64_t committed_step() const override { return trainer_->committed_step(); }

  absl::Status TrainRound(const v1::Assignment& assignment, Backend* backend,
                          absl::Duration process_group_time) override {
    ObservedBackend observed(backend);
    std::function<int64_t()> gpu_memory;
    if (cuda_) {
      gpu_memory = [device = *cuda_device_] { return CudaMemoryInUse(device); };
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
    round.backend = &observed;
    round.cuda_device = *cuda_device_;
    round.report_step = [&telemetry](const StepReport& report, int64_t samples) {
      return telemetry.OnStep(report, samples);
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
    if (assignment.may_grow()) {
      round.reform_requested = [reporter = reporter_] {
        return reporter->verdict().reform_at_step_boundary;
      };
    }
    absl::Status trained = trainer_->Train(round);
    if (!trained.ok()) {
      if (!IsReformAtStepBoundary(trained)) {
        telemetry.SetError(std::string(trained.message()));
      }
      return trained;
    }
    telemetry.SetState(v1::WORKER_STATE_STOPPING);
    return absl::OkStatus();
  }

 private:
  Trainer* const trainer_;
  HealthReporter* const reporter_;
  const bool cuda_;
  const int* const cuda_device_;  // set for each round's assignment
};

// The join request: the launcher's, or one built from `options`.
absl::StatusOr<v1::JoinRequest> MakeRequest(
    const JobOptions& options, const std::optional<LaunchedProcess>& launched,
    std::string* address) {
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
  join.join_timeout = options.join_timeout;
  join.last_call_timeout = options.last_call_timeout;
  join.address = *address;
  if (options.cuda) {
    join.device_type = v1::DEVICE_TYPE_CUDA;
    join.device_count = options.cuda_devices;
    join.nccl_available = NcclUsable();
  }
  return BuildJoinRequest(join);
}

}  // namespace

absl::Status RunJob(const JobOptions& options, Trainer* trainer) {
  if (trainer == nullptr) return absl::InvalidArgumentError("RunJob needs a trainer");
  if (options.max_recoveries < 0) {
    return absl::InvalidArgumentError("max_recoveries must be >= 0");
  }
  if (options.cuda && options.cuda_devices < 1) {
    return absl::FailedPreconditionError(
        "the job trains on CUDA but this process sees no GPU");
  }
  GS_ASSIGN_OR_RETURN(std::optional<LaunchedProcess> launched,
                      LaunchedProcessFromEnvironment());
  const std::string coordinator =
      launched.has_value() ? launched->coordinator : options.coordinator;
  std::string address = options.address.empty()
                            ? DefaultWorkerAddress(coordinator)
                            : options.address;
  GS_ASSIGN_OR_RETURN(v1::JoinRequest request,
                      MakeRequest(options, launched, &address));

  ClientOptions client_options;
  client_options.target = coordinator;
  client_options.tls = {options.tls_ca, options.tls_cert, options.tls_key};
  GS_ASSIGN_OR_RETURN(client_options.token, ClientToken(options.token_file));
  GS_ASSIGN_OR_RETURN(auto client, CoordinatorClient::Create(client_options));

  ElasticOptions elastic;
  if (launched.has_value()) elastic.first_assignment = launched->assignment;
  elastic.max_recoveries = options.max_recoveries;
  ProcessGroupOptions& pg = elastic.process_group;
  pg.timeout = options.timeout;
  pg.address = address;
  pg.network_interface = options.network_interface;
  pg.shared_memory = options.shared_memory;
  elastic.on_assignment = [&pg, &options](const v1::Assignment& assignment) {
    if (options.cuda) {
      pg.cuda_device = assignment.local_rank() % options.cuda_devices;
    }
  };

  HealthReporter reporter(client.get());
  RoundAdapter adapter(trainer, &reporter, options.cuda, &pg.cuda_device);
  absl::Status trained =
      RunElastic(client.get(), request, elastic, &reporter, &adapter);
  if (!trained.ok()) {
    absl::Status reported =
        reporter.Finish(false, EXIT_FAILURE, std::string(trained.message()));
    if (!reported.ok()) {
      GS_LOG(WARNING) << "could not report the failure: " << reported;
    }
  }
  return trained;  // success was reported by RunElastic
}

}  // namespace gradsync
