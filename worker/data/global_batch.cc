#include "worker/data/global_batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {

absl::StatusOr<GlobalBatchPlan> GlobalBatchPlan::Create(int64_t global_batch,
                                                        int64_t micro_batch,
                                                        int64_t epoch_size) {
  if (global_batch < 1 || micro_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the global batch (", global_batch, ") and the micro-batch (",
        micro_batch, ") must be at least 1"));
  }
  if (global_batch % micro_batch != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the global batch (", global_batch,
        ") must be a multiple of the micro-batch size (batch_size ",
        micro_batch, ")"));
  }
  if (epoch_size < global_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("an epoch of ", epoch_size,
                     " samples holds no whole global batch of ", global_batch));
  }
  return GlobalBatchPlan(global_batch, micro_batch, epoch_size);
}

MicroBatchShare GlobalBatchPlan::EvenShare(int rank, int world) const {
  const int64_t m = micro_batches_per_step();
  const int64_t base = m / world;
  const int64_t extra = m % world;
  MicroBatchShare share;
  share.count = base + (rank < extra ? 1 : 0);
  share.first = rank * base + std::min<int64_t>(rank, extra);
  return share;
}

absl::StatusOr<MicroBatchShare> GlobalBatchPlan::Share(
    int rank, int world, const std::vector<int>& shares) const {
  if (shares.empty()) return EvenShare(rank, world);
  int64_t sum = 0;
  bool negative = false;
  for (int s : shares) {
    sum += s;
    negative = negative || s < 0;
  }
  if (static_cast<int>(shares.size()) != world || negative ||
      sum != micro_batches_per_step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch shares ", absl::StrJoin(shares, ","), " do not divide ",
        micro_batches_per_step(), " micro-batches among ", world,
        " ranks"));
  }
  MicroBatchShare share;
  for (int r = 0; r < rank; ++r) share.first += shares[r];
  share.count = shares[rank];
  return share;
}

SampleSpan GlobalBatchPlan::MicroBatchSpan(int64_t step_start, int64_t j) const {
  const int64_t begin = step_start + j * micro_batch_;
  return SampleSpan{begin, begin + micro_batch_};
}

absl::Status GlobalBatchPlan::CheckStepStart(int64_t epoch_position) const {
  if (epoch_position >= 0 && epoch_position % global_batch_ == 0 &&
      epoch_position + global_batch_ <= epoch_size_) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no step of a global batch of ", global_batch_,
      " begins at epoch position ", epoch_position, " (an epoch of ",
      epoch_size_, " samples)"));
}

}  // namespace gradsync
