#include "worker/trainer/trainer.h"

#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/failpoint.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/data/datasets.h"
#include "worker/data/distributed_sampler.h"
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

namespace gradsync {
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
  GS_RETURN_IF_ERROR(work->Wait(timeout));
  return t.item<double>();
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Appends "round step epoch rank i,j,..." to `path` in one write(2), so the
// line is whole even if the process is killed right after.
void LogSamples(const std::string& path, int64_t round, int64_t step,
                int64_t epoch, int rank, const torch::Tensor& batch) {
  torch::Tensor host = batch.cpu();
  const int64_t* p = host.data_ptr<int64_t>();
  std::string line = absl::StrCat(round, " ", step, " ", epoch, " ", rank, " ",
                                  absl::StrJoin(p, p + host.numel(), ","), "\n");
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot open the sample log ", path);
  const ssize_t written = ::write(fd, line.data(), line.size());
  ::close(fd);
  TORCH_CHECK(written == static_cast<ssize_t>(line.size()),
              "cannot write the sample log ", path);
}

// Aggregates the steps after warm-up into the summary.
class StepStats {
 public:
  void Add(const StepReport& report) {
    step_times_.push_back(report.step_time);
    forward_ += report.ddp.forward;
    backward_ += report.ddp.backward_compute;
    communication_ += report.ddp.communication;
    exposed_ += report.ddp.exposed_communication;
    hidden_ += report.ddp.hidden_communication;
    last_ = report.ddp;
  }
  void Fill(int64_t samples_per_step, TrainSummary* summary) const {
    if (step_times_.empty()) return;
    const int64_t n = static_cast<int64_t>(step_times_.size());
    absl::Duration total;
    for (absl::Duration d : step_times_) total += d;
    std::vector<absl::Duration> sorted = step_times_;
    std::sort(sorted.begin(), sorted.end());
    summary->mean_step_time = total / n;
    summary->median_step_time = sorted[n / 2];
    summary->samples_per_second =
        samples_per_step * n / std::max(absl::ToDoubleSeconds(total), 1e-9);
    summary->mean_forward = forward_ / n;
    summary->mean_backward = backward_ / n;
    summary->mean_communication = communication_ / n;
    summary->mean_exposed_communication = exposed_ / n;
    summary->mean_hidden_communication = hidden_ / n;
    summary->buckets = last_.buckets;
    summary->bucket_bytes_per_step = 0;
    for (const BucketTiming& b : last_.bucket_timings) {
      summary->bucket_bytes_per_step += b.bytes;
    }
  }

 private:
  std::vector<absl::Duration> step_times_;
  absl::Duration forward_, backward_, communication_, exposed_, hidden_;
  StepTimings last_;
};

// Where training is, as every rank agrees after a round starts: the part of
// the state that is not tensors.
struct Position {
  int64_t step = 0;            // optimizer steps committed
  int64_t epoch = 0;
  int64_t epoch_position = 0;  // samples of the epoch's order consumed

  std::vector<int64_t> ToCounters() const { return {step, epoch, epoch_position}; }
  static Position FromCounters(const std::vector<int64_t>& c) {
    return Position{c[0], c[1], c[2]};
  }
};

// One round's division of the current epoch among its ranks, from the
// epoch position the round started at, and how far this rank has got in it.
struct Division {
  int64_t epoch = 0;
  int64_t start = 0;      // epoch position the division begins at
  int64_t span = 0;       // samples of the epoch it covers (no padding)
  int64_t batches = 0;    // this rank's batches in it
  // Under uneven inputs, the most batches any rank has in it (the steps
  // the job takes in it); otherwise `batches`.
  int64_t job_batches = 0;
  int64_t next = 0;       // this rank's next batch
  int64_t global_batch = 0;  // samples per batch across ranks
  torch::Tensor indices;  // this rank's sample indices, on the device
};

// One micro-batch of a step: its samples, and how its loss counts.
struct MicroBatch {
  torch::Tensor indices;  // on the device
  int64_t epoch = 0;
  // The loss is the cross-entropy's mean over the micro-batch (or with
  // `sum`, its sum) divided by `divisor`; a micro-batch that does not
  // `count` is run only so that the rank takes part in the step's
  // all-reduce: its loss is multiplied by zero.
  bool sum = false;
  double divisor = 1;
  bool counts = true;
};

}  // namespace

class TrainingRun::Impl {
 public:
  Impl(TrainerConfig config, torch::Device device, torch::nn::Sequential model,
       ImageDataset data, std::optional<GlobalBatchPlan> plan)
      : config_(std::move(config)),
        device_(device),
        model_(std::move(model)),
        data_(std::move(data)),
        plan_(std::move(plan)) {
    ResetOptimizer();
    for (const auto& p : model_->parameters()) parameters_ += p.numel();
  }

  absl::StatusOr<TrainSummary> TrainRound(const TrainContext& context);
  int64_t committed_step() const { return position_.step; }
  bool has_state() const { return has_state_; }

  // Opens the checkpoint folder, and with --resume loads its newest
  // checkpoint.
  absl::Status OpenCheckpoints();

 private:
  void ResetOptimizer() {
    optimizer_ = std::make_unique<torch::optim::SGD>(
        model_->parameters(),
        torch::optim::SGDOptions(config_.lr).momentum(config_.momentum));
  }
  absl::StatusOr<TrainSummary> TrainRoundOrThrow(
      const TrainContext& context, std::unique_ptr<DistributedDataParallel>* ddp);
  absl::Status JoinRound(const TrainContext& context,
                         std::unique_ptr<DistributedDataParallel>* ddp);
  // Readies the round's data (the division of the epoch, or a check that
  // the global batch's step may start here); returns the steps training
  // takes in all.
  absl::StatusOr<int64_t> StartRoundData(const TrainContext& context,
                                         DistributedDataParallel* ddp,
                                         Division* division);
  absl::Status StartDivision(const TrainContext& context, Division* division);
  bool Done() const;
  int64_t MicroBatchesLeft(const Division& division, int world_size) const;
  absl::Status RunStep(const TrainContext& context, DistributedDataParallel* ddp,
                       Division* division, int64_t total_steps);
  torch::Tensor NextBatch(const TrainContext& context, Division* division,
                          Position* cursor, int64_t step);
  // A step's micro-batches, advancing `cursor` past them and adding the
  // samples the step consumes across ranks to `global_samples`: this rank's
  // next `accumulate` batches, or its share of the global batch.
  std::vector<MicroBatch> RankMicroBatches(const TrainContext& context,
                                           Division* division, int64_t step,
                                           Position* cursor,
                                           int64_t* global_samples);
  std::vector<MicroBatch> GlobalMicroBatches(const TrainContext& context,
                                             int64_t step, Position* cursor,
                                             int64_t* global_samples);
  // The epoch's global order (the one-rank sampler's), on the device.
  const torch::Tensor& EpochOrder(int64_t epoch);
  // The replica's fingerprint when one is due after committed step `step`
  // (every fingerprint_every steps and after the last); null otherwise.
  absl::StatusOr<std::shared_ptr<const ReplicaDigest>> MaybeFingerprint(
      int64_t step, Clock* clock);
  // Forward and backward of one micro-batch (synchronizing the gradients
  // when `sync`); returns its loss, detached.
  torch::Tensor RunMicroBatch(DistributedDataParallel* ddp,
                              const MicroBatch& micro, bool sync);
  absl::Status Report(const TrainContext& context, const StepReport& report,
                      int64_t total_steps);
  // At a step boundary: ReformAtStepBoundary when any rank was asked to
  // re-form the round (collective).
  absl::Status AgreeOnReform(const TrainContext& context);
  absl::StatusOr<TrainSummary> Finish(const TrainContext& context);
  // After a step committed: reports the round's start once.
  void ReportRoundStart(const TrainContext& context);
  // Rank 0 writes a checkpoint when one is due: every checkpoint_every steps
  // and, with `last`, after the last step.
  absl::Status MaybeCheckpoint(const TrainContext& context, bool last);
  bool uneven() const { return !config_.rank_batches.empty(); }
  // Uneven inputs: a scope per epoch, and the end of this rank's epoch
  // (collective: shadows the ranks still training until all are done).
  absl::Status BeginUnevenEpoch(DistributedDataParallel* ddp);
  absl::Status FinishUnevenEpoch(const TrainContext& context,
                                 DistributedDataParallel* ddp,
                                 Division* division);

  const TrainerConfig config_;
  const torch::Device device_;
  torch::nn::Sequential model_;
  ImageDataset data_;
  // With global_batch_size: how each step's samples are shared out, and the
  // order of the epoch `epoch_order_of_`.
  const std::optional<GlobalBatchPlan> plan_;
  torch::Tensor epoch_order_;
  int64_t epoch_order_of_ = -1;
  std::unique_ptr<torch::optim::SGD> optimizer_;
  int64_t parameters_ = 0;
  Position position_;
  std::optional<CheckpointDir> checkpoints_;
  // Under uneven inputs: this epoch's scope and the step it began at.
  std::unique_ptr<UnevenInputs> uneven_;
  int64_t epoch_start_step_ = 0;
  bool has_state_ = false;
  StepStats stats_;
  double final_loss_ = 0;
  absl::Time window_start_;
  int64_t window_samples_ = 0;
  // The current round's start: when it began and when the state was copied;
  // reported once its first step commits.
  absl::Time round_begin_;
  absl::Time state_copied_;
  bool round_start_reported_ = false;
  // Replica fingerprints taken, and the time they took.
  int64_t fingerprints_ = 0;
  absl::Duration fingerprint_time_;
};

absl::StatusOr<std::unique_ptr<TrainingRun>> TrainingRun::Create(
    const TrainerConfig& config) {
  try {
    GS_RETURN_IF_ERROR(ValidateConfig(config));
    const torch::Device device =
        config.device == "cuda" ? torch::Device(torch::kCUDA, config.device_index)
                                : torch::Device(torch::kCPU);
    torch::manual_seed(config.seed);
    GS_ASSIGN_OR_RETURN(torch::nn::Sequential model, MakeModel(config.model));
    if (config.sync_batchnorm) {
      GS_RETURN_IF_ERROR(ConvertSyncBatchNorm(model.ptr()).status());
    }
    if (!config.load_params.empty()) {
      GS_RETURN_IF_ERROR(LoadParameters(*model, config.load_params));
    }
    model->to(device);
    GS_ASSIGN_OR_RETURN(ImageDataset data, LoadDataset(config));
    data.images = data.images.to(device);
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

absl::StatusOr<int64_t> TrainingRun::Impl::StartRoundData(
    const TrainContext& context, DistributedDataParallel* ddp,
    Division* division) {
  if (plan_.has_value()) {
    GS_RETURN_IF_ERROR(plan_->CheckStepStart(position_.epoch_position));
    return config_.steps > 0 ? config_.steps
                             : config_.epochs * plan_->steps_per_epoch();
  }
  GS_RETURN_IF_ERROR(StartDivision(context, division));
  GS_RETURN_IF_ERROR(BeginUnevenEpoch(ddp));
  if (config_.steps > 0) return config_.steps;
  return position_.step +
         (MicroBatchesLeft(*division, context.world_size) +
          config_.accumulate - 1) / config_.accumulate;
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

absl::Status TrainingRun::Impl::MaybeCheckpoint(const TrainContext& context,
                                                bool last) {
  if (!checkpoints_.has_value() || context.rank != 0) return absl::OkStatus();
  const bool due = config_.checkpoint_every > 0 &&
                   position_.step % config_.checkpoint_every == 0;
  if (!due && !last) return absl::OkStatus();
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

// Divides the rest of the current epoch among the round's ranks; moves to
// the next epoch when nothing of it is left for them.
absl::Status TrainingRun::Impl::StartDivision(const TrainContext& context,
                                              Division* division) {
  for (;;) {
    GS_ASSIGN_OR_RETURN(
        DistributedSampler sampler,
        DistributedSampler::Create({data_.size(), context.rank,
                                    context.world_size, config_.shuffle,
                                    config_.seed, config_.drop_last,
                                    position_.epoch_position}));
    sampler.SetEpoch(position_.epoch);
    division->epoch = position_.epoch;
    division->start = position_.epoch_position;
    division->span = data_.size() - position_.epoch_position;
    const int64_t batches =
        (sampler.num_samples() + config_.batch_size - 1) / config_.batch_size;
    division->batches = batches;
    division->job_batches = batches;
    if (uneven()) {  // every rank's share has the same number of batches
      const auto& caps = config_.rank_batches;
      division->batches = std::min(batches, caps[context.rank]);
      division->job_batches =
          std::min(batches, *std::max_element(caps.begin(), caps.end()));
    }
    division->next = 0;
    division->global_batch = int64_t{config_.batch_size} * context.world_size;
    division->indices =
        torch::tensor(sampler.Indices(), torch::kInt64).to(device_);
    if (batches > 0) return absl::OkStatus();
    if (position_.epoch_position == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the dataset (", data_.size(), " samples) leaves rank ",
          context.rank, " nothing to train on"));
    }
    position_.epoch += 1;  // the rest of this epoch is too small to divide
    position_.epoch_position = 0;
  }
}

bool TrainingRun::Impl::Done() const {
  return config_.steps > 0 ? position_.step >= config_.steps
                           : position_.epoch >= config_.epochs;
}

// Micro-batches from `division`'s next batch to the end of training (epoch
// mode), were the world size to stay; under uneven inputs, the job's steps.
int64_t TrainingRun::Impl::MicroBatchesLeft(const Division& division,
                                            int world_size) const {
  absl::StatusOr<DistributedSampler> whole = DistributedSampler::Create(
      {data_.size(), 0, world_size, config_.shuffle, config_.seed,
       config_.drop_last});
  const int64_t per_rank = whole.ok() ? whole->num_samples() : 0;
  int64_t per_epoch = (per_rank + config_.batch_size - 1) / config_.batch_size;
  int64_t this_epoch = division.batches - division.next;
  if (uneven()) {  // the job's steps: its longest rank's
    const auto& caps = config_.rank_batches;
    per_epoch = std::min(per_epoch, *std::max_element(caps.begin(), caps.end()));
    this_epoch = std::max<int64_t>(division.job_batches - division.next, 0);
  }
  return this_epoch + (config_.epochs - division.epoch - 1) * per_epoch;
}

// This rank's next batch (advancing `cursor`, a copy of the position that
// becomes the committed one when the step commits); moves `division` to the
// next epoch at its end.
torch::Tensor TrainingRun::Impl::NextBatch(const TrainContext& context,
                                           Division* division, Position* cursor,
                                           int64_t step) {
  if (division->next == division->batches) {
    Position saved = position_;
    position_ = *cursor;
    absl::Status started = StartDivision(context, division);
    position_ = saved;
    TORCH_CHECK(started.ok(), started.ToString());
  }
  const int64_t j = division->next++;
  const int64_t rows = division->indices.size(0);
  torch::Tensor batch = division->indices.slice(
      0, j * config_.batch_size,
      std::min<int64_t>((j + 1) * config_.batch_size, rows));
  cursor->epoch = division->epoch;
  cursor->epoch_position =
      division->start +
      std::min(division->span, (j + 1) * division->global_batch);
  if (division->next == division->batches) {
    cursor->epoch += 1;  // the epoch is over
    cursor->epoch_position = 0;
  }
  if (!config_.sample_log.empty()) {
    LogSamples(config_.sample_log, context.round, step, division->epoch,
               context.rank, batch);
  }
  return batch;
}

std::vector<MicroBatch> TrainingRun::Impl::RankMicroBatches(
    const TrainContext& context, Division* division, int64_t step,
    Position* cursor, int64_t* global_samples) {
  const int64_t count =
      config_.steps > 0
          ? config_.accumulate
          : std::min<int64_t>(config_.accumulate,
                              MicroBatchesLeft(*division, context.world_size));
  std::vector<MicroBatch> micro;
  for (int64_t m = 0; m < count; ++m) {
    torch::Tensor batch = NextBatch(context, division, cursor, step);
    *global_samples += batch.size(0) * context.world_size;
    micro.push_back(MicroBatch{std::move(batch), division->epoch,
                               /*sum=*/false, static_cast<double>(count)});
  }
  return micro;
}

const torch::Tensor& TrainingRun::Impl::EpochOrder(int64_t epoch) {
  if (epoch_order_of_ != epoch) {
    absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(
        {data_.size(), 0, 1, config_.shuffle, config_.seed, false, 0});
    TORCH_CHECK(sampler.ok(), sampler.status().ToString());
    sampler->SetEpoch(epoch);
    epoch_order_ = torch::tensor(sampler->Indices(), torch::kInt64).to(device_);
    epoch_order_of_ = epoch;
  }
  return epoch_order_;
}

std::vector<MicroBatch> TrainingRun::Impl::GlobalMicroBatches(
    const TrainContext& context, int64_t step, Position* cursor,
    int64_t* global_samples) {
  const torch::Tensor& order = EpochOrder(cursor->epoch);
  const MicroBatchShare share =
      plan_->EvenShare(context.rank, context.world_size);
  const double divisor = plan_->LossDivisor(context.world_size);
  std::vector<MicroBatch> micro;
  for (int64_t j = share.first; j < share.first + share.count; ++j) {
    const SampleSpan span = plan_->MicroBatchSpan(cursor->epoch_position, j);
    micro.push_back(MicroBatch{order.slice(0, span.begin, span.end),
                               cursor->epoch, /*sum=*/true, divisor});
    if (!config_.sample_log.empty()) {
      LogSamples(config_.sample_log, context.round, step, cursor->epoch,
                 context.rank, micro.back().indices);
    }
  }
  if (micro.empty()) {  // more ranks than micro-batches: zero gradients
    const SampleSpan span = plan_->MicroBatchSpan(cursor->epoch_position, 0);
    micro.push_back(MicroBatch{order.slice(0, span.begin, span.end),
                               cursor->epoch, /*sum=*/true, divisor,
                               /*counts=*/false});
  }
  *global_samples += plan_->global_batch();
  cursor->epoch_position += plan_->global_batch();
  if (plan_->EndsEpoch(cursor->epoch_position)) {
    cursor->epoch += 1;  // the tail shorter than a global batch is dropped
    cursor->epoch_position = 0;
  }
  return micro;
}

torch::Tensor TrainingRun::Impl::RunMicroBatch(DistributedDataParallel* ddp,
                                               const MicroBatch& micro,
                                               bool sync) {
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
  loss.backward();
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

// One optimizer step: its micro-batches (all but the last under no_sync),
// then the update. The step commits (the position advances) only
// once the update is applied, and the update is applied only once every
// gradient collective of the step is known to have completed without error
// on this rank (DistributedDataParallel::CheckStep: on a GPU the backward
// only ordered the streams after them); an error before leaves the state as
// it was. The host waits for the device once per step, there; the loss is
// summed on the device meanwhile.
absl::Status TrainingRun::Impl::RunStep(const TrainContext& context,
                                        DistributedDataParallel* ddp,
                                        Division* division,
                                        int64_t total_steps) {
  const absl::Time step_start = context.clock->Now();
  StepReport report;
  report.step = position_.step + 1;
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
  torch::Tensor step_loss = torch::zeros({}, torch::TensorOptions(device_));
  int64_t step_samples = 0;
  for (size_t m = 0; m < micro.size(); ++m) {
    step_loss += RunMicroBatch(ddp, micro[m], m + 1 == micro.size());
    if (micro[m].counts) step_samples += micro[m].indices.size(0);
  }
  if (ddp != nullptr) GS_RETURN_IF_ERROR(ddp->CheckStep());
  report.loss = step_loss.item<double>();
  optimizer_->step();
  cursor.step = report.step;
  position_ = cursor;  // committed
  // Under uneven inputs the last checkpoint waits for every rank.
  GS_RETURN_IF_ERROR(MaybeCheckpoint(context, Done() && !uneven()));
  Failpoint(kFailpointStep);
  if (FailpointFiresAtStep(kFailpointCorruptParameters, report.step)) {
    GS_RETURN_IF_ERROR(FlipOneParameterBit(*model_));
  }
  GS_ASSIGN_OR_RETURN(report.fingerprint,
                      MaybeFingerprint(report.step, context.clock));
  window_samples_ += global_samples;
  report.step_time = context.clock->Now() - step_start;
  if (ddp != nullptr) report.ddp = ddp->last_step_timings();
  if (report.step > config_.warmup_steps) stats_.Add(report);
  ReportRoundStart(context);
  if (context.on_step) GS_RETURN_IF_ERROR(context.on_step(report, step_samples));
  return Report(context, report, total_steps);
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
    context.on_round_started(state_copied_ - round_begin_,
                             context.clock->Now() - state_copied_);
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
