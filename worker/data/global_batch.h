// An exact global batch (--global_batch_size): how every optimizer step's B
// samples are cut into micro-batches and shared among a round's ranks, so
// that a step consumes the same samples with the same weight whatever the
// world size.
#ifndef GRADSYNC_WORKER_DATA_GLOBAL_BATCH_H_
#define GRADSYNC_WORKER_DATA_GLOBAL_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsync {

// A contiguous run of a step's micro-batches: [first, first + count).
struct MicroBatchShare {
  int64_t first = 0;
  int64_t count = 0;
};

// Epoch-order positions [begin, end) of one micro-batch.
struct SampleSpan {
  int64_t begin = 0;
  int64_t end = 0;
};

// Step k of an epoch consumes positions [k*B, (k+1)*B) of the epoch's global
// order (the order a one-rank DistributedSampler gives: 0..N-1, or the
// epoch's permutation with shuffle), cut into M = B / b micro-batches of b
// samples. Each rank runs a contiguous share of them, accumulating
// gradients, and divides its samples' loss sum by B / world: the average
// all-reduce divides by the world size, so the update is the mean gradient
// over the B samples on any world size; only the summation order changes.
// An epoch has floor(N / B) steps: a tail shorter than B is dropped, as
// torch.utils.data.DataLoader(batch_size=B, drop_last=True) drops it.
// Arithmetic only (no LibTorch, no transport). A value type: thread-safe to
// read, immutable after Create.
class GlobalBatchPlan {
 public:
  // INVALID_ARGUMENT when B or b is below 1, B is not a multiple of b, or an
  // epoch of `epoch_size` samples holds no whole global batch.
  static absl::StatusOr<GlobalBatchPlan> Create(int64_t global_batch,
                                                int64_t micro_batch,
                                                int64_t epoch_size);

  int64_t global_batch() const { return global_batch_; }
  int64_t micro_batch() const { return micro_batch_; }
  int64_t micro_batches_per_step() const { return global_batch_ / micro_batch_; }
  int64_t steps_per_epoch() const { return epoch_size_ / global_batch_; }

  // Rank `rank` of `world`'s share of every step's micro-batches: M / W each
  // and one more for the first M % W ranks, in rank order. With more ranks
  // than micro-batches, the last ranks get none (they take part in the
  // gradient all-reduce with zero gradients). Needs 0 <= rank < world.
  MicroBatchShare EvenShare(int rank, int world) const;

  // Rank `rank`'s share when each rank r runs shares[r] of the step's
  // micro-batches (the coordinator's Assignment.micro_batch_shares), in
  // rank order; the even share when `shares` is empty. INVALID_ARGUMENT
  // unless there is one share per rank of `world`, none negative, summing
  // to micro_batches_per_step(). The loss divisor stays B / world: each
  // sample still counts 1 / B whoever runs it.
  absl::StatusOr<MicroBatchShare> Share(int rank, int world,
                                        const std::vector<int>& shares) const;

  // The positions of micro-batch `j` of the step that begins at epoch
  // position `step_start`.
  SampleSpan MicroBatchSpan(int64_t step_start, int64_t j) const;

  // What a rank of a round of `world` ranks divides the sum of its
  // samples' losses by: B / world (then the average all-reduce's division by
  // the world size makes each sample count 1 / B).
  double LossDivisor(int world) const {
    return static_cast<double>(global_batch_) / static_cast<double>(world);
  }

  // OK when a step may begin at `epoch_position` (a multiple of B with a
  // whole global batch after it); FAILED_PRECONDITION otherwise, e.g. for a
  // checkpoint written by a run without --global_batch_size or with another
  // B, or a Python loop's step beyond the epoch.
  absl::Status CheckStepStart(int64_t epoch_position) const;

  // Whether the step that ends at `epoch_position` ends its epoch (no whole
  // global batch is left after it).
  bool EndsEpoch(int64_t epoch_position) const {
    return epoch_position + global_batch_ > epoch_size_;
  }

 private:
  GlobalBatchPlan(int64_t global_batch, int64_t micro_batch, int64_t epoch_size)
      : global_batch_(global_batch),
        micro_batch_(micro_batch),
        epoch_size_(epoch_size) {}

  int64_t global_batch_;
  int64_t micro_batch_;
  int64_t epoch_size_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DATA_GLOBAL_BATCH_H_
