// TrainingRun's implementation, shared by the files that define its parts:
// trainer.cc (rounds, steps, checkpoints, reports) and training_data.cc
// (which samples each step trains on: the division of an epoch among
// ranks, or the global batch's shares). Private to worker/trainer.
#ifndef GRADSYNC_WORKER_TRAINER_TRAINING_RUN_IMPL_H_
#define GRADSYNC_WORKER_TRAINER_TRAINING_RUN_IMPL_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/data/datasets.h"
#include "worker/data/global_batch.h"
#include "worker/ddp/buffer_snapshot.h"
#include "worker/ddp/checkpoint.h"
#include "worker/ddp/distributed_data_parallel.h"
#include "worker/ddp/replica_digest.h"
#include "worker/ddp/uneven_inputs.h"
#include "worker/trainer/trainer.h"

namespace gradsync {
namespace trainer_internal {

// Appends `line` to the file at `path` in one write(2), so the line is
// whole even if the process is killed right after (the sample and step
// logs); throws c10::Error when it cannot.
void AppendLogLine(const std::string& path, const std::string& line);

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
    commit_wait_ += report.commit_wait;
    update_ += report.update;
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
    summary->mean_commit_wait = commit_wait_ / n;
    summary->mean_update = update_ / n;
    summary->buckets = last_.buckets;
    summary->bucket_bytes_per_step = 0;
    for (const BucketTiming& b : last_.bucket_timings) {
      summary->bucket_bytes_per_step += b.bytes;
    }
  }

 private:
  std::vector<absl::Duration> step_times_;
  absl::Duration forward_, backward_, communication_, exposed_, hidden_;
  absl::Duration commit_wait_, update_;
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

}  // namespace trainer_internal

class TrainingRun::Impl {
 public:
  using Position = trainer_internal::Position;
  using Division = trainer_internal::Division;
  using MicroBatch = trainer_internal::MicroBatch;

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
  // With config.slowdown above 1 it sleeps between the forward and the
  // backward (see TrainerConfig::slowdown).
  torch::Tensor RunMicroBatch(DistributedDataParallel* ddp,
                              const MicroBatch& micro, bool sync);
  // What a step's micro-batches gave: their summed loss (on the device),
  // the samples that count, and how long they took: all of them, and all
  // but the last (whose backward also waits for the step's collectives).
  struct MicroBatchesRun {
    torch::Tensor loss;
    int64_t samples = 0;
    absl::Duration total;
    absl::Duration unsynced;
  };
  // Runs `micro` (all but the last under no_sync), timed on the device when
  // the straggler balancer needs it (see the definition).
  MicroBatchesRun RunMicroBatches(const TrainContext& context,
                                  DistributedDataParallel* ddp,
                                  const std::vector<MicroBatch>& micro);
  // After step `report->step` committed: checkpoint, failpoints and the
  // replica's fingerprint when due.
  absl::Status AfterCommit(const TrainContext& context, StepReport* report);
  absl::Status Report(const TrainContext& context, const StepReport& report,
                      int64_t total_steps);
  // At a step boundary: ReformAtStepBoundary when any rank was asked to
  // re-form the round (collective).
  absl::Status AgreeOnReform(const TrainContext& context);
  absl::StatusOr<TrainSummary> Finish(const TrainContext& context);
  // After a step committed: reports the round's start once.
  void ReportRoundStart(const TrainContext& context);
  // Whether a checkpoint is due after the step committed last: every
  // checkpoint_every steps and, with `last`, after the last step.
  bool CheckpointDue(bool last) const;
  // Rank 0 writes a checkpoint when one is due.
  absl::Status MaybeCheckpoint(const TrainContext& context, bool last);
  // The failpoint hang:STEP, before `step`'s first collective.
  absl::Status MaybeHang(const TrainContext& context, int64_t step);
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
  // The buffers at the start of the step in progress, put back if it fails
  // (a forward already moved BatchNorm's statistics); empty between steps.
  BufferSnapshot step_start_buffers_;
  std::optional<CheckpointDir> checkpoints_;
  // Under uneven inputs: this epoch's scope and the step it began at.
  std::unique_ptr<UnevenInputs> uneven_;
  int64_t epoch_start_step_ = 0;
  bool has_state_ = false;
  trainer_internal::StepStats stats_;
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
  // The compute of the last micro-batch (forward and backward, without the
  // slowdown's sleep), for the next one's slowdown; whether this round is
  // slowed (config_.slowdown, slowdown_until_round).
  absl::Duration last_micro_batch_compute_;
  bool slowed_ = false;
  // Warned that the round's micro-batch shares did not fit.
  int64_t bad_shares_round_ = -1;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TRAINER_TRAINING_RUN_IMPL_H_
