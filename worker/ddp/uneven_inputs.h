// Uneven inputs: ranks that run out of data at different times (PyTorch's
// Join context manager for DDP). Without it, a rank whose data ended stops
// issuing collectives and the others hang in their next all-reduce.
//
//   // Before the loop, on every rank:
//   GS_ASSIGN_OR_RETURN(auto uneven, UnevenInputs::Create(ddp.get()));
//   for (auto& batch : my_batches) {         // as many as this rank has
//     loss_fn(ddp->forward(batch.x), batch.y).backward();
//     optimizer.step();
//   }
//   GS_RETURN_IF_ERROR(uneven->Finish());    // shadows the others until done
//
// While the scope is active, every forward through the wrapper first
// all-gathers which ranks still train (one small collective per step). A
// rank in Finish() answers each of the others' steps with the same
// collectives: the buffer broadcast, and every gradient bucket with zeros
// (through the comm hook), so the ranks still training divide the summed
// gradients by their own number (PyTorch's divide_by_initial_world_size =
// False, the default here: each step averages over the ranks that
// contributed to it) or by the world size (true). When every rank has
// finished, the model of the last rank to finish (the highest such rank) is
// broadcast to all, as PyTorch's post-hook does, so every rank ends with the
// same parameters and buffers; optimizer state is not copied.
//
// Collectives outside DDP's forward and backward (a loss all-reduce, a
// barrier) must not run inside the scope: a rank that finished would not
// match them. SyncBatchNorm layers cannot be shadowed (Create refuses).
#ifndef GRADSYNC_WORKER_DDP_UNEVEN_INPUTS_H_
#define GRADSYNC_WORKER_DDP_UNEVEN_INPUTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/ddp/distributed_data_parallel.h"

namespace gradsync {

struct UnevenInputsOptions {
  // Divide every step's summed gradients by the world size instead of by
  // the number of ranks still training.
  bool divide_by_initial_world_size = false;
};

// Not thread-safe: the training loop's thread uses it. Lifetime: inside the
// DDP model's; one scope per model at a time.
class UnevenInputs {
 public:
  // Activates the protocol on `ddp` (not collective; every rank does it
  // before its loop). FAILED_PRECONDITION when the model has SyncBatchNorm
  // layers or another scope is active.
  static absl::StatusOr<std::unique_ptr<UnevenInputs>> Create(
      DistributedDataParallel* ddp,
      UnevenInputsOptions options = UnevenInputsOptions());
  // Deactivates the protocol; a scope left without Finish() leaves the
  // other ranks waiting for this one (their collectives time out).
  ~UnevenInputs();
  UnevenInputs(const UnevenInputs&) = delete;
  UnevenInputs& operator=(const UnevenInputs&) = delete;

  // Collective: this rank is out of data. Matches the other ranks' steps
  // until every rank has called Finish(), then makes every rank's model the
  // last finisher's. The backend's status when a collective fails;
  // FAILED_PRECONDITION when called twice.
  absl::Status Finish();

  // The steps this rank shadowed in Finish(), for tests and logs.
  int64_t shadowed_steps() const { return shadowed_steps_; }

 private:
  friend class DistributedDataParallel;

  // What one rank says at the start of each step: whether it still trains,
  // whether its backward synchronizes, and whether this is its first check
  // after running out of data. All-gathered.
  struct Vote {
    int64_t active = 0;
    int64_t sync = 0;
    int64_t just_finished = 0;
  };
  // What the ranks agreed on.
  struct Tally {
    int64_t active = 0;
    bool sync = false;
    // The highest rank still training (-1: none): the buffers' source.
    int authority = -1;
    // The highest rank that just finished (-1: none).
    int last_finisher = -1;
  };

  UnevenInputs(DistributedDataParallel* ddp, UnevenInputsOptions options)
      : ddp_(ddp), options_(options) {}

  // Collective: all-gathers `vote`, throws (c10::Error) on failure after
  // recording it in the DDP model (the forward path), or returns it.
  absl::StatusOr<Tally> Exchange(const Vote& vote);
  int64_t Divisor(const Tally& tally) const;

  DistributedDataParallel* const ddp_;
  const UnevenInputsOptions options_;
  bool finished_ = false;
  int64_t shadowed_steps_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_UNEVEN_INPUTS_H_
