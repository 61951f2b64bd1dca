// The reference training loop of gradsync-worker: a model from models.h on
// a dataset from worker/data, SGD on the cross-entropy mean over each rank's
// batch, with gradients synchronized by DistributedDataParallel.
#ifndef GRADSYNC_WORKER_TRAINER_TRAINER_H_
#define GRADSYNC_WORKER_TRAINER_TRAINER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/gradsync/v1/job.pb.h"
#include "worker/backend/backend.h"
#include "worker/ddp/powersgd_hook.h"
#include "worker/ddp/reducer.h"
#include "worker/runtime/step_report.h"
#include "worker/trainer/models.h"

namespace gradsync {

struct TrainerConfig {
  ModelConfig model;
  // Every BatchNorm of the model becomes a SyncBatchNorm (statistics of the
  // global batch).
  bool sync_batchnorm = false;
  // "synthetic" (images of the shape the model takes), "mnist" or "cifar10"
  // (read from data_dir; the model must take their images).
  std::string dataset = "synthetic";
  std::string data_dir;
  // Images in the synthetic dataset.
  int64_t synthetic_size = 60000;
  // Samples per rank per micro-batch.
  int batch_size = 32;
  // An exact global batch (0: off, the per-rank batch above): every
  // optimizer step consumes the next global_batch_size samples of the
  // epoch's global order, cut into micro-batches of batch_size and shared
  // among the round's ranks (worker/data/global_batch.h), with the loss the
  // mean over those samples whatever the world size; a shrink or grow
  // changes only the summation order. A multiple of batch_size; needs
  // accumulate 1 (the shares set each rank's micro-batches), no
  // rank_batches and no sync_batchnorm (ranks run different numbers of
  // forward passes, and SyncBatchNorm's forward is a collective). An epoch's
  // tail shorter than the global batch is dropped whatever drop_last says.
  int64_t global_batch_size = 0;
  // For tests and benchmarks: at least 1; above, every micro-batch sleeps,
  // between its forward and its backward, (slowdown - 1) times the compute
  // of the latest micro-batch that did not synchronize (whose backward did
  // not wait for the buckets), so that this rank's compute takes about
  // slowdown times as long (gradsync-worker --slowdown). Needs steps of
  // several micro-batches (an exact global batch, or accumulate) to act.
  // With slowdown_until_round R > 0, only in rounds up to R (a straggler
  // that recovers).
  double slowdown = 1;
  int64_t slowdown_until_round = 0;
  // For tests: every training step first sleeps this long, before its
  // first forward (a step that takes seconds without costing CPU: the
  // self-set timeouts with slow steps). Zero: none.
  absl::Duration step_sleep = absl::ZeroDuration();
  // Every this many steps, and after the last, the step's report carries a
  // fingerprint of the replica (parameters and optimizer state) for the
  // coordinator to compare across ranks (worker/ddp/replica_fingerprint.h);
  // 0: never.
  int64_t fingerprint_every = 100;
  // Optimizer steps to run; 0: `epochs` passes over the data.
  int64_t steps = 0;
  int epochs = 1;
  double lr = 0.01;
  double momentum = 0.0;
  // Sampler: reshuffle every epoch (seeded by seed + epoch), drop the uneven
  // tail instead of padding.
  bool shuffle = false;
  bool drop_last = false;
  // Seeds parameter initialization, the synthetic data and the shuffle.
  uint64_t seed = 0;
  // The CPU, a CUDA GPU, or a simulated GPU (DEVICE_TYPE_SIM: the tensors
  // stay in host memory and every GPU code path of the loop and of DDP is
  // taken; the NCCL backend runs over the simulated device).
  v1::DeviceType device = v1::DEVICE_TYPE_CPU;
  // The GPU (or simulated device) of this process.
  int device_index = 0;
  // Micro-batches per optimizer step: all but the last run under no_sync,
  // and each micro-batch's loss is divided by their number.
  int accumulate = 1;
  // DDP's options (buckets, find_unused_parameters, ...).
  ReducerOptions reducer;
  bool broadcast_buffers = true;
  // How gradient buckets are reduced: "allreduce", "fp16_compress",
  // "bf16_compress" or "powersgd" (with `powersgd`'s settings; its
  // compression state starts afresh in every round).
  std::string comm_hook = "allreduce";
  PowerSgdOptions powersgd;
  // Uneven inputs: per rank, at most this many batches per epoch (so ranks
  // run out of data at different times; DDP's UnevenInputs keeps the others
  // going). Empty: every rank trains its whole share. Needs a round of
  // exactly that many ranks, --accumulate=1 and epochs (not --steps); the
  // loss is not averaged over ranks for the progress line and the round is
  // not re-formed at step boundaries.
  std::vector<int64_t> rank_batches;
  // Checkpoints: rank 0 writes one to checkpoint_dir every checkpoint_every
  // steps (0: never) and after the last step, keeping the newest
  // checkpoint_keep. With resume, the run starts from the newest checkpoint
  // there (every process reads it), or from scratch when there is none.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int checkpoint_keep = 3;
  bool resume = false;
  // Progress line every this many steps (and after the last); 0: never.
  int log_every = 10;
  // Steps left out of the summary's timings (warm-up).
  int warmup_steps = 2;
  std::string load_params;
  std::string save_params;
  // When set, each micro-batch's sample indices are appended here as one
  // line "round step epoch rank i,j,...", written before the batch runs (so a
  // test can check that every sample of an epoch was used once across
  // recoveries: per step, the latest round's lines count).
  std::string sample_log;
  // When set, each committed step appends "round step loss sum" here: the
  // step's loss on this rank and the sum of the absolute values of the
  // parameters after its update (as doubles, %.17g), so a test can find the
  // first step at which a run parted from another.
  std::string step_log;
  // Parameters, data and gradients in double precision. For tests that
  // compare runs whose reductions sum in another order (a global batch
  // divided differently among ranks): in single precision those differ by
  // rounding, which a ReLU can turn into a different step when a
  // pre-activation sits that close to zero.
  bool float64 = false;
};

// What a training run did, for the progress line and benchmarks.
struct TrainSummary {
  int64_t steps = 0;
  int64_t parameters = 0;
  // Loss of the last step averaged over ranks.
  double final_loss = 0;
  // Over the steps after warm-up: mean and median step time, global
  // samples/s, and the mean DDP breakdown.
  absl::Duration mean_step_time;
  absl::Duration median_step_time;
  double samples_per_second = 0;
  absl::Duration mean_forward;
  absl::Duration mean_backward;
  absl::Duration mean_communication;
  absl::Duration mean_exposed_communication;
  absl::Duration mean_hidden_communication;
  // The host's waits after the micro-batches: for the step's collectives to
  // be known good (and its loss), then for the update (StepReport).
  absl::Duration mean_commit_wait;
  absl::Duration mean_update;
  // Gradient buckets and the bytes this rank put into their collectives,
  // per synchronized step (the last one; with a compressing hook, less than
  // the gradients' size).
  int buckets = 0;
  int64_t bucket_bytes_per_step = 0;
  // Replica fingerprints taken (all steps, warm-up included) and their
  // mean time, part of their steps' times.
  int64_t fingerprints = 0;
  absl::Duration mean_fingerprint;
};

// Where Train runs and reports.
struct TrainContext {
  // Gradients are synchronized through it; nullptr trains alone (no DDP).
  Backend* backend = nullptr;
  int rank = 0;
  int world_size = 1;
  // The rank whose training state every rank copies before the first step
  // (Assignment.source_rank), and the round, for the sample log.
  int source_rank = 0;
  int64_t round = 0;
  // With global_batch_size: each rank's micro-batches per step, by rank
  // (the coordinator's Assignment.micro_batch_shares); empty: an even
  // division.
  std::vector<int> micro_batch_shares;
  // Rank 0 prints progress here; nullptr prints nothing.
  std::FILE* progress = stdout;
  // Called after every optimizer step on the training thread with the step
  // and the samples this process consumed in it; must be cheap. An error
  // stops training with that error.
  std::function<absl::Status(const StepReport&, int64_t samples)> on_step;
  // Called once per round, after its first step committed (before on_step
  // for that step), with the time the state copy took (with the model check)
  // and the time from then to that step's commit.
  std::function<void(absl::Duration state_transfer, absl::Duration first_step)>
      on_round_started;
  // Set when the round may grow (Assignment.may_grow): after every step that
  // leaves training unfinished, whether the coordinator asked this member
  // to re-form the round at a step boundary. The ranks agree with a
  // one-element all-reduce after each such step, so that all stop after the
  // same committed step; TrainRound then returns ReformAtStepBoundary
  // (worker/runtime/reform.h). Unset, no step pays for that all-reduce.
  std::function<bool()> reform_requested;
  // Blocks until the round is over (the coordinator ended this member): the
  // failpoint hang:STEP stands still in it. Unset: that failpoint cannot
  // apply (FAILED_PRECONDITION).
  std::function<void()> await_round_over;
  Clock* clock = RealClock::Get();
};

// One training run that can move from round to round: the model, its
// optimizer, the data and where training is (steps committed, epoch,
// position in the epoch). A step commits when its optimizer update is
// applied; a step that fails is discarded, so after an error the run holds
// the state of its last committed step and can train on in a new round
// (a new backend, possibly another world size): that is how gradsync
// recovers a job in place. Not thread-safe: one thread drives it.
class TrainingRun {
 public:
  // Validates `config`, builds the model (seeded by config.seed, or loaded
  // from load_params) and its optimizer, and loads the data. Errors:
  // INVALID_ARGUMENT for bad settings, FAILED_PRECONDITION (e.g. CUDA
  // requested without CUDA), NOT_FOUND/DATA_LOSS for data or parameter files.
  static absl::StatusOr<std::unique_ptr<TrainingRun>> Create(
      const TrainerConfig& config);
  ~TrainingRun();

  // Trains in one round until the run is done. Collective when
  // `context.backend` is set: first every rank copies rank
  // `context.source_rank`'s training state (parameters, buffers, optimizer
  // state, RNG, steps and data position), then the rest of the epoch is
  // divided among the round's ranks from the global data position, so no
  // sample is skipped or repeated when the world size changed. Errors:
  // FAILED_PRECONDITION for mismatched models across ranks; the backend's
  // status when a collective failed (UNAVAILABLE: a peer left;
  // DEADLINE_EXCEEDED; ABORTED: the round was superseded, or it re-forms at
  // a step boundary, see TrainContext::reform_requested); INTERNAL for an
  // error inside LibTorch.
  absl::StatusOr<TrainSummary> TrainRound(const TrainContext& context);

  // Optimizer steps committed so far.
  int64_t committed_step() const;
  // Whether the run has trained in a round, so its state is worth copying
  // (a fresh run has none).
  bool has_state() const;

 private:
  class Impl;
  explicit TrainingRun(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Trains per `config` in one round (TrainingRun::Create + TrainRound).
// Collective when `context.backend` is set: every rank calls it with the
// same config. Errors: those of Create and TrainRound. Not thread-safe: runs
// on the calling thread.
absl::StatusOr<TrainSummary> Train(const TrainerConfig& config,
                                   const TrainContext& context);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TRAINER_TRAINER_H_
