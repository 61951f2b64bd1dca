// Training checkpoints: the model, the optimizer and where training is, in
// one file that Python's torch.load reads in PyTorch's own layouts, so a
// job can resume from it here or in PyTorch, and the reverse:
//
//   {"format": "gradsync-checkpoint/1",
//    "model": {name: tensor},                 (model.module.state_dict())
//    "optimizer": {"state": {index: {...}},   (optimizer.state_dict())
//                  "param_groups": [{..., "params": [index, ...]}]},
//    "step": int, "counters": {name: int},    (epoch, data position, ...)
//    "rng_state": uint8 tensor}               (torch.get_rng_state())
//
// A CheckpointDir writes checkpoint-<step>.pt atomically (temporary file,
// fsync, rename) and keeps the newest few.
#ifndef GRADSYNC_WORKER_DDP_CHECKPOINT_H_
#define GRADSYNC_WORKER_DDP_CHECKPOINT_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/ddp/state_dict.h"

namespace gradsync {

inline constexpr char kCheckpointFormat[] = "gradsync-checkpoint/1";

// One checkpoint, in memory.
struct Checkpoint {
  // Optimizer steps committed.
  int64_t step = 0;
  // The training loop's position besides the step (epoch, samples of the
  // epoch consumed, ...).
  std::map<std::string, int64_t> counters;
  StateDict model;
  // PyTorch's optimizer.state_dict() layout (OptimizerStateDict).
  c10::IValue optimizer;
  // The CPU generator's state (torch.get_rng_state()); undefined: none.
  torch::Tensor rng_state;
};

// Captures `module`'s state (copied to the CPU), `optimizer`'s, the CPU
// generator's state, `step` and `counters`. UNIMPLEMENTED for optimizers
// other than SGD, Adam and AdamW.
absl::StatusOr<Checkpoint> CaptureCheckpoint(
    const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
    int64_t step, std::map<std::string, int64_t> counters);

// Puts `checkpoint` back: the module's parameters and buffers
// (LoadStateDict's checks; a "module." prefix is accepted), the optimizer's
// state (LoadOptimizerStateDict) and the CPU generator. Checks everything
// before changing anything.
absl::Status RestoreCheckpoint(const Checkpoint& checkpoint,
                               torch::nn::Module& module,
                               torch::optim::Optimizer& optimizer);

// `optimizer`'s state in PyTorch's optimizer.state_dict() layout: per
// parameter (numbered across param groups in order) SGD's momentum_buffer
// (None before the first step), Adam's and AdamW's step, exp_avg,
// exp_avg_sq (and max_exp_avg_sq with amsgrad); per group its
// hyperparameters and parameter numbers. UNIMPLEMENTED for other
// optimizers.
absl::StatusOr<c10::IValue> OptimizerStateDict(
    const torch::optim::Optimizer& optimizer);

// Loads a state OptimizerStateDict or PyTorch wrote into `optimizer` (of
// the same kind, with the same param groups of the same sizes): its
// per-parameter state and its groups' hyperparameters. FAILED_PRECONDITION
// naming the first mismatch, and nothing changed.
absl::Status LoadOptimizerStateDict(torch::optim::Optimizer& optimizer,
                                    const c10::IValue& state);

// A folder of checkpoints. Not thread-safe; one writer (rank 0) at a time.
class CheckpointDir {
 public:
  // Creates `dir` if needed. INVALID_ARGUMENT for an empty path or keep < 1;
  // INTERNAL when the folder cannot be made.
  static absl::StatusOr<CheckpointDir> Open(std::string dir, int keep);

  // Writes checkpoint-<step>.pt (replacing one of the same step), then
  // removes all but the newest `keep` checkpoints. INTERNAL naming the file
  // on failure; the older checkpoints are left alone then.
  absl::Status Save(const Checkpoint& checkpoint);

  // The newest checkpoint that reads back whole (a damaged one is skipped,
  // with a warning naming it); nullopt when there is none.
  absl::StatusOr<std::optional<Checkpoint>> LoadLatest() const;

  // The checkpoint files, oldest first.
  std::vector<std::string> List() const;

  const std::string& dir() const { return dir_; }

 private:
  CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

  std::string dir_;
  int keep_;
};

// Reads one checkpoint file. Errors: ReadTorchFile's, or DATA_LOSS for a
// file of another format.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);
absl::Status WriteCheckpoint(const Checkpoint& checkpoint,
                             const std::string& path);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_CHECKPOINT_H_
