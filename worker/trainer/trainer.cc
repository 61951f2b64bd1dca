#include "worker/trainer/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/failpoint.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/data/datasets.h"
#include "worker/data/global_batch.h"
#include "worker/ddp/checkpoint.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/distributed_data_parallel.h"
#include "worker/ddp/replica_fingerprint.h"
#include "worker/ddp/state_dict.h"
#include "worker/ddp/sync_batch_norm.h"
#include "worker/ddp/tensor_buffer.h"
#include "worker/ddp/training_state.h"
#include "worker/ddp/uneven_inputs.h"
#include "worker/runtime/reform.h"
#include "worker/trainer/trainer_setup.h"
#include "worker/trainer/training_run_impl.h"

namespace gradsync {

using trainer_internal::Division;
using trainer_internal::MicroBatch;
using trainer_internal::Position;

namespace {

// The mean of `value` over all ranks (one small all-reduce).
absl::StatusOr<double> MeanOverRanks(Backend* backend, double value,
                                     const torch::Device& device,
                                     absl::Duration timeout) {
  if (backend == nullptr) return value;
  torch::Tensor t = torch::full({1}, value,
                                torch::TensorOptions(torch::kFloat64).device(device));
  GS_ASSIGN_OR_RETURN(Buffer buffer, ToBuffer(t));
  std::shared_ptr<Work> work = backend->AllReduce(buffer, ReduceOp::kAverage);
  GS_RETURN_IF_ERROR(backend->Await(*work, timeout));
  return t.item<double>();
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// The step's times are read off the wall clock (Clock::Now), which may be
// stepped back while a step runs (NTP): a time that came out negative
// counts as 0, not as a report the runtime refuses after the step
// committed.
absl::Duration NotNegative(absl::Duration d) {
  return std::max(d, absl::ZeroDuration());
}

void ClampClockSteps(StepReport* report) {
  for (absl::Duration* d :
       {&report->step_time, &report->commit_wait, &report->update,
        &report->micro_batch_time, &report->ddp.forward,
        &report->ddp.backward_compute, &report->ddp.communication,
        &report->ddp.exposed_communication,
        &report->ddp.hidden_communication}) {
    *d = NotNegative(*d);
  }
}

// Appends "round step loss sum" to `path` (TrainerConfig::step_log).
void LogStep(const std::string& path, int64_t round, int64_t step, double loss,
             torch::nn::Module& model) {
  double sum = 0;
  for (const torch::Tensor& p : model.parameters()) {
    sum += p.detach().to(torch::kFloat64).abs().sum().item<double>();
  }
  trainer_internal::AppendLogLine(
      path, absl::StrFormat("%d %d %.17g %.17g\n", round, step, loss, sum));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingRun>> TrainingRun::Create(
    const TrainerConfig& config) {
  try {
    GS_RETURN_IF_ERROR(ValidateConfig(config));
    // A simulated GPU keeps its tensors in host memory.
    const torch::Device device =
        config.device == v1::DEVICE_TYPE_CUDA
            ? torch::Device(torch::kCUDA, config.device_index)
            : torch::Device(torch::kCPU);
    torch::manual_seed(config.seed);
    GS_ASSIGN_OR_RETURN(torch::nn::Sequential model, MakeModel(config.model));
    if (config.sync_batchnorm) {
      GS_RETURN_IF_ERROR(ConvertSyncBatchNorm(model.ptr()).status());
    }
    if (!config.load_params.empty()) {
      GS_RETURN_IF_ERROR(LoadParameters(*model, config.load_params));
    }
    const torch::Dtype dtype =
        config.float64 ? torch::kFloat64 : torch::kFloat32;
    model->to(device, dtype);
    GS_ASSIGN_OR_RETURN(ImageDataset data, LoadDataset(config));
    data.images = data.images.to(device, dtype);
    data.labels = data.labels.to(device);
    std::optional<GlobalBatchPlan> plan;
    if (config.global_batch_size > 0) {
      GS_ASSIGN_OR_RETURN(plan, GlobalBatchPlan::Create(
                                    config.global_batch_size, config.batch_size,
                                    data.size()));
    }
    auto impl = std::make_unique<Impl>(config, device, std::move(model),
                                       std::move(data), std::move(plan));
    GS_RETURN_IF_ERROR(impl->OpenCheckpoints());
    return std::unique_ptr<TrainingRun>(new TrainingRun(std::move(impl)));
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

TrainingRun::TrainingRun(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TrainingRun::~TrainingRun() = default;

int64_t TrainingRun::committed_step() const { return impl_->committed_step(); }
bool TrainingRun::has_state() const { return impl_->has_state(); }

absl::StatusOr<TrainSummary> TrainingRun::TrainRound(const TrainContext& context) {
  return impl_->TrainRound(context);
}

absl::StatusOr<TrainSummary> TrainingRun::Impl::TrainRound(
    const TrainContext& context) {
  std::unique_ptr<DistributedDataParallel> ddp;
  absl::StatusOr<TrainSummary> result;
  try {
    result = TrainRoundOrThrow(context, &ddp);
  } catch (const c10::Error& e) {
    // The reducer fails backward() this way when a collective fails: report
    // the backend's own status, so the caller can tell a lost peer.
    absl::Status collective =
        ddp != nullptr ? ddp->communication_error() : absl::OkStatus();
    result = !collective.ok() ? collective
                              : absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    result = absl::InternalError(e.what());
  }
  // A step that failed leaves the buffers as it found them: the next round
  // may copy this rank's state to the others, and trains the step again.
  if (!result.ok()) step_start_buffers_.Restore();
  uneven_.reset();  // it refers to the round's DDP model, which goes now
  return result;
}

absl::StatusOr<TrainSummary> TrainingRun::Impl::TrainRoundOrThrow(
    const TrainContext& context, std::unique_ptr<DistributedDataParallel>* ddp) {
  if (uneven() &&
      config_.rank_batches.size() != static_cast<size_t>(context.world_size)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--rank_batches lists ", config_.rank_batches.size(),
        " ranks but the round has ", context.world_size));
  }
  round_begin_ = context.clock->Now();
  round_start_reported_ = false;
  slowed_ = config_.slowdown > 1 && (config_.slowdown_until_round <= 0 ||
                                     context.round <= config_.slowdown_until_round);
  GS_RETURN_IF_ERROR(JoinRound(context, ddp));
  state_copied_ = context.clock->Now();
  Division division;
  GS_ASSIGN_OR_RETURN(const int64_t total_steps,
                      StartRoundData(context, ddp->get(), &division));
  window_start_ = context.clock->Now();
  window_samples_ = 0;
  for (;;) {
    if (uneven_ != nullptr && division.next == division.batches) {
      GS_RETURN_IF_ERROR(FinishUnevenEpoch(context, ddp->get(), &division));
    }
    if (Done()) break;
    GS_RETURN_IF_ERROR(RunStep(context, ddp->get(), &division, total_steps));
    if (!Done() && context.reform_requested && !uneven()) {
      GS_RETURN_IF_ERROR(AgreeOnReform(context));
    }
  }
  return Finish(context);
}

absl::Status TrainingRun::Impl::BeginUnevenEpoch(DistributedDataParallel* ddp) {
  epoch_start_step_ = position_.step;
  if (!uneven() || ddp == nullptr) return absl::OkStatus();
  GS_ASSIGN_OR_RETURN(uneven_, UnevenInputs::Create(ddp));
  return absl::OkStatus();
}

absl::Status TrainingRun::Impl::FinishUnevenEpoch(const TrainContext& context,
                                                  DistributedDataParallel* ddp,
                                                  Division* division) {
  GS_RETURN_IF_ERROR(uneven_->Finish());
  uneven_.reset();
  // Every rank is done with the epoch; the job took its longest rank's steps.
  position_ = Position{epoch_start_step_ + division->job_batches,
                       division->epoch + 1, 0};
  GS_RETURN_IF_ERROR(MaybeCheckpoint(context, Done()));
  if (Done()) return absl::OkStatus();
  GS_RETURN_IF_ERROR(StartDivision(context, division));
  return BeginUnevenEpoch(ddp);
}

absl::Status TrainingRun::Impl::OpenCheckpoints() {
  if (config_.checkpoint_dir.empty()) return absl::OkStatus();
  GS_ASSIGN_OR_RETURN(checkpoints_, CheckpointDir::Open(config_.checkpoint_dir,
                                                        config_.checkpoint_keep));
  if (!config_.resume) return absl::OkStatus();
  GS_ASSIGN_OR_RETURN(std::optional<Checkpoint> latest,
                      checkpoints_->LoadLatest());
  if (!latest.has_value()) {
    GS_LOG(INFO) << "--resume: no checkpoint in " << config_.checkpoint_dir
                 << ": starting from step 0";
    return absl::OkStatus();
  }
  GS_RETURN_IF_ERROR(RestoreCheckpoint(*latest, *model_, *optimizer_));
  position_ = Position{latest->step, latest->counters["epoch"],
                       latest->counters["epoch_position"]};
  has_state_ = true;
  GS_LOG(INFO) << "--resume: resumed from the checkpoint of step "
               << position_.step << " in " << config_.checkpoint_dir;
  return absl::OkStatus();
}

bool TrainingRun::Impl::CheckpointDue(bool last) const {
  if (!checkpoints_.has_value()) return false;
  return last || (config_.checkpoint_every > 0 &&
                  position_.step % config_.checkpoint_every == 0);
}

absl::Status TrainingRun::Impl::MaybeCheckpoint(const TrainContext& context,
                                                bool last) {
  if (context.rank != 0 || !CheckpointDue(last)) return absl::OkStatus();
  GS_ASSIGN_OR_RETURN(
      Checkpoint checkpoint,
      CaptureCheckpoint(*model_, *optimizer_, position_.step,
                        {{"epoch", position_.epoch},
                         {"epoch_position", position_.epoch_position}}));
  return checkpoints_->Save(checkpoint);
}

// Wraps the model for the round's backend and makes every rank's state the
// source rank's.
absl::Status TrainingRun::Impl::JoinRound(
    const TrainContext& context, std::unique_ptr<DistributedDataParallel>* ddp) {
  if (context.backend == nullptr) {
    has_state_ = true;
    return absl::OkStatus();
  }
  DdpOptions options;
  options.reducer = config_.reducer;
  options.broadcast_buffers = config_.broadcast_buffers;
  options.broadcast_initial_state = false;  // the source's state, below
  GS_ASSIGN_OR_RETURN(*ddp, DistributedDataParallel::Create(
                                model_.ptr(), context.backend, options,
                                context.clock));
  std::vector<int64_t> counters = position_.ToCounters();
  GS_RETURN_IF_ERROR(BroadcastTrainingState(context.backend,
                                            context.source_rank, *model_,
                                            *optimizer_, &counters,
                                            config_.reducer.timeout));
  position_ = Position::FromCounters(counters);
  has_state_ = true;
  // A hook of this round's own, its state starting afresh on every rank.
  GS_ASSIGN_OR_RETURN(std::shared_ptr<CommHook> hook, MakeCommHook(config_));
  if (auto* powersgd = dynamic_cast<PowerSgdHook*>(hook.get())) {
    powersgd->ResumeAt(position_.step);
  }
  return (*ddp)->RegisterCommHook(std::move(hook));
}

torch::Tensor TrainingRun::Impl::RunMicroBatch(DistributedDataParallel* ddp,
                                               const MicroBatch& micro,
                                               bool sync) {
  const absl::Time start = absl::Now();
  torch::Tensor x = data_.images.index_select(0, micro.indices);
  torch::Tensor y = data_.labels.index_select(0, micro.indices);
  // PyTorch's loop: out = ddp(x); loss = loss_fn(out, y).
  torch::Tensor output;
  if (ddp == nullptr) {
    output = model_->forward(x);
  } else if (!sync) {
    auto no_sync = ddp->NoSync();
    output = ddp->forward(x);
  } else {
    output = ddp->forward(x);
  }
  namespace F = torch::nn::functional;
  torch::Tensor loss =
      micro.sum ? F::cross_entropy(
                      output, y, F::CrossEntropyFuncOptions().reduction(torch::kSum))
                : F::cross_entropy(output, y);
  loss = loss / micro.divisor;
  if (!micro.counts) loss = loss * 0.0;
  absl::Duration slept;
  if (slowed_) {  // before the backward, which may launch buckets
    slept = last_micro_batch_compute_ * (config_.slowdown - 1);
    absl::SleepFor(slept);
  }
  loss.backward();
  // A synchronizing backward also waits for the step's buckets: only the
  // others measure this rank's compute.
  if (!sync) last_micro_batch_compute_ = absl::Now() - start - slept;
  return loss.detach();
}

absl::StatusOr<std::shared_ptr<const ReplicaDigest>>
TrainingRun::Impl::MaybeFingerprint(int64_t step, Clock* clock) {
  const int64_t every = config_.fingerprint_every;
  if (every <= 0 || (step % every != 0 && !Done())) return nullptr;
  const absl::Time start = clock->Now();
  GS_ASSIGN_OR_RETURN(ReplicaDigest digest,
                      FingerprintReplica(*model_, *optimizer_));
  fingerprint_time_ += clock->Now() - start;
  ++fingerprints_;
  return std::make_shared<const ReplicaDigest>(std::move(digest));
}

// The failpoint hang:STEP: stands still before the step's first collective
// while the heartbeats go on, until the round is over; then fails the round
// as a hung rank whose collectives were aborted would.
absl::Status TrainingRun::Impl::MaybeHang(const TrainContext& context,
                                          int64_t step) {
  if (!FailpointFiresAtStep(kFailpointHang, step)) return absl::OkStatus();
  if (!context.await_round_over) {
    return absl::FailedPreconditionError(
        "the failpoint hang needs a coordinator to end the round");
  }
  context.await_round_over();
  return absl::AbortedError(absl::StrCat(
      "failpoint hang: stood still before step ", step,
      " until the coordinator ended the round"));
}

// One optimizer step: its micro-batches (all but the last under no_sync),
// then the update. The step commits (the position advances) only
// once the update is applied, and the update is applied only once every
// gradient collective of the step is known to have completed without error
// on this rank (DistributedDataParallel::CheckStep: on a GPU the backward
// only ordered the streams after them); an error before leaves the state as
// it was (TrainRound puts back the buffers the forwards moved). The host
// waits for the device once per step, there; the loss is summed on the
// device meanwhile.
absl::Status TrainingRun::Impl::RunStep(const TrainContext& context,
                                        DistributedDataParallel* ddp,
                                        Division* division,
                                        int64_t total_steps) {
  const absl::Time step_start = context.clock->Now();
  StepReport report;
  report.step = position_.step + 1;
  GS_RETURN_IF_ERROR(MaybeHang(context, report.step));
  absl::SleepFor(config_.step_sleep);
  Position cursor = position_;
  int64_t global_samples = 0;
  const std::vector<MicroBatch> micro =
      plan_.has_value()
          ? GlobalMicroBatches(context, report.step, &cursor, &global_samples)
          : RankMicroBatches(context, division, report.step, &cursor,
                             &global_samples);
  report.epoch = micro.empty() ? position_.epoch : micro.back().epoch;
  // Zero in place: with gradient_as_bucket_view the gradients are the
  // buckets, so they must stay where they are.
  for (auto& p : model_->parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  step_start_buffers_.Take(*model_);
  const MicroBatchesRun run = RunMicroBatches(context, ddp, micro);
  const absl::Time computed = context.clock->Now();
  if (ddp != nullptr) GS_RETURN_IF_ERROR(ddp->CheckStep());
  report.loss = run.loss.item<double>();
  const absl::Time checked = context.clock->Now();
  optimizer_->step();
  report.commit_wait = checked - computed;
  report.update = context.clock->Now() - checked;
  cursor.step = report.step;
  position_ = cursor;  // committed
  step_start_buffers_.Clear();
  GS_RETURN_IF_ERROR(AfterCommit(context, &report));
  if (!config_.step_log.empty()) {
    LogStep(config_.step_log, context.round, report.step, report.loss,
            *model_);
  }
  window_samples_ += global_samples;
  report.step_time = context.clock->Now() - step_start;
  if (ddp != nullptr) report.ddp = ddp->last_step_timings();
  if (plan_.has_value() && micro.front().counts) {
    // The last backward waits for the step's buckets: that wait (the
    // exposed communication) is the peers' time, not this rank's.
    report.micro_batches = static_cast<int>(micro.size());
    report.micro_batches_per_step =
        static_cast<int>(plan_->micro_batches_per_step());
    report.micro_batch_time =
        micro.size() > 1
            ? run.unsynced / static_cast<int64_t>(micro.size() - 1)
            : std::max(run.total - report.ddp.exposed_communication,
                       absl::ZeroDuration());
  }
  ClampClockSteps(&report);
  if (report.step > config_.warmup_steps) stats_.Add(report);
  ReportRoundStart(context);
  if (context.on_step) GS_RETURN_IF_ERROR(context.on_step(report, run.samples));
  return Report(context, report, total_steps);
}

// On a GPU the host runs ahead of the device, so for the straggler
// balancer's speeds (an exact global batch) the device is waited for before
// the first micro-batch and after the one before the last: two waits a
// step, both before any gradient collective of the step starts.
TrainingRun::Impl::MicroBatchesRun TrainingRun::Impl::RunMicroBatches(
    const TrainContext& context, DistributedDataParallel* ddp,
    const std::vector<MicroBatch>& micro) {
  MicroBatchesRun run;
  run.loss = torch::zeros({}, torch::TensorOptions(device_));
  const bool time_on_device =
      device_.is_cuda() && plan_.has_value() && micro.size() > 1;
  if (time_on_device) torch::cuda::synchronize();
  const absl::Time start = context.clock->Now();
  for (size_t m = 0; m < micro.size(); ++m) {
    const bool last = m + 1 == micro.size();
    run.loss += RunMicroBatch(ddp, micro[m], last);
    if (micro[m].counts) run.samples += micro[m].indices.size(0);
    if (last) continue;
    if (time_on_device && m + 2 == micro.size()) torch::cuda::synchronize();
    run.unsynced = context.clock->Now() - start;
  }
  run.total = context.clock->Now() - start;
  return run;
}

absl::Status TrainingRun::Impl::AfterCommit(const TrainContext& context,
                                            StepReport* report) {
  // Under uneven inputs the last checkpoint waits for every rank.
  report->checkpoint = CheckpointDue(Done() && !uneven());
  GS_RETURN_IF_ERROR(MaybeCheckpoint(context, Done() && !uneven()));
  Failpoint(kFailpointStep);
  if (FailpointFiresAtStep(kFailpointCorruptParameters, report->step)) {
    GS_RETURN_IF_ERROR(FlipOneParameterBit(*model_));
  }
  GS_ASSIGN_OR_RETURN(report->fingerprint,
                      MaybeFingerprint(report->step, context.clock));
  return absl::OkStatus();
}

// Every log_every steps and after the last: the loss averaged over ranks
// and, on rank 0, a progress line.
absl::Status TrainingRun::Impl::Report(const TrainContext& context,
                                       const StepReport& report,
                                       int64_t total_steps) {
  const bool last = Done();
  if (!last && (config_.log_every <= 0 || report.step % config_.log_every != 0)) {
    return absl::OkStatus();
  }
  if (uneven()) {
    final_loss_ = report.loss;  // a rank out of data would not match a collective
  } else {
    GS_ASSIGN_OR_RETURN(final_loss_,
                        MeanOverRanks(context.backend, report.loss, device_,
                                      config_.reducer.timeout));
  }
  const absl::Time now = context.clock->Now();
  const double rate = window_samples_ /
                      std::max(absl::ToDoubleSeconds(now - window_start_), 1e-9);
  window_start_ = now;
  window_samples_ = 0;
  if (context.progress == nullptr || context.rank != 0 || config_.log_every <= 0) {
    return absl::OkStatus();
  }
  std::string line = absl::StrFormat(
      "step %lld/%lld  epoch %lld  loss %.4f  %.0f samples/s  step %.1f ms",
      static_cast<long long>(report.step), static_cast<long long>(total_steps),
      static_cast<long long>(report.epoch), final_loss_, rate,
      Ms(report.step_time));
  if (context.backend != nullptr) {
    const StepTimings& t = report.ddp;
    absl::StrAppendFormat(
        &line, " (forward %.1f, backward %.1f, comm %.1f, exposed %.1f)",
        Ms(t.forward), Ms(t.backward_compute), Ms(t.communication),
        Ms(t.exposed_communication));
  }
  std::fprintf(context.progress, "%s\n", line.c_str());
  std::fflush(context.progress);
  return absl::OkStatus();
}

absl::Status TrainingRun::Impl::AgreeOnReform(const TrainContext& context) {
  const bool asked = context.reform_requested();
  absl::StatusOr<double> any =
      MeanOverRanks(context.backend, asked ? 1.0 : 0.0, device_,
                    config_.reducer.timeout);
  // A rank that saw the agreement first may already have rejoined, and the
  // coordinator ended the round under this rank's all-reduce: the step is
  // committed all the same (whether the round ended as planned, the next
  // assignment says: reform.h).
  if (!any.ok()) {
    return asked ? ReformVoteFailed(position_.step, any.status())
                 : any.status();
  }
  if (*any > 0) return ReformAtStepBoundary(position_.step);
  return absl::OkStatus();
}

void TrainingRun::Impl::ReportRoundStart(const TrainContext& context) {
  if (round_start_reported_) return;
  round_start_reported_ = true;
  if (context.on_round_started) {
    context.on_round_started(NotNegative(state_copied_ - round_begin_),
                             NotNegative(context.clock->Now() - state_copied_));
  }
}

absl::StatusOr<TrainSummary> TrainingRun::Impl::Finish(
    const TrainContext& context) {
  TrainSummary summary;
  summary.steps = position_.step;
  summary.parameters = parameters_;
  summary.final_loss = final_loss_;
  summary.fingerprints = fingerprints_;
  if (fingerprints_ > 0) summary.mean_fingerprint = fingerprint_time_ / fingerprints_;
  stats_.Fill(plan_.has_value() ? plan_->global_batch()
                               : int64_t{config_.batch_size} *
                                     config_.accumulate * context.world_size,
              &summary);
  if (!config_.save_params.empty() && context.rank == 0) {
    GS_RETURN_IF_ERROR(SaveParameters(*model_, config_.save_params));
  }
  return summary;
}

absl::StatusOr<TrainSummary> Train(const TrainerConfig& config,
                                   const TrainContext& context) {
  GS_ASSIGN_OR_RETURN(std::unique_ptr<TrainingRun> run,
                      TrainingRun::Create(config));
  return run->TrainRound(context);
}

}  // namespace gradsync
