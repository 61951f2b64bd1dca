// Which samples each rank trains on: the semantics of PyTorch's
// torch.utils.data.DistributedSampler, index for index.
#ifndef GRADSYNC_WORKER_DATA_DISTRIBUTED_SAMPLER_H_
#define GRADSYNC_WORKER_DATA_DISTRIBUTED_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsync {

struct SamplerOptions {
  int64_t dataset_size = 0;
  int rank = 0;
  int world_size = 1;
  // Shuffle each epoch with the permutation torch.randperm draws from a
  // generator seeded with seed + epoch.
  bool shuffle = false;
  uint64_t seed = 0;
  // Drop the tail that does not divide evenly among ranks instead of padding
  // with samples from the start.
  bool drop_last = false;
  // Divide the epoch's order only from this position on: the samples before
  // it were consumed by an earlier division (before the world size changed),
  // so every sample is used once per epoch. In [0, dataset_size]; 0 divides
  // the whole epoch, as PyTorch does.
  int64_t start = 0;
};

// Without shuffle, rank r of W takes indices r, r+W, r+2W, ...; with
// shuffle, the same positions of the epoch's permutation. With a `start`,
// the same applies to the order's positions from `start` on (padding repeats
// the start of that remainder). Without drop_last
// the index list is padded by repeating its start so every rank gets
// num_samples(); with it, the tail is dropped. Matches PyTorch 1.13's
// sampler index for index (tested against its output), so a job can switch
// between them and see the same batches.
// A value type; not thread-safe to mutate (SetEpoch) while reading.
class DistributedSampler {
 public:
  // INVALID_ARGUMENT for a negative size, a world size < 1, a rank outside
  // [0, world_size) or a start outside [0, dataset_size].
  static absl::StatusOr<DistributedSampler> Create(SamplerOptions options);

  // Chooses the epoch's permutation (with shuffle); call before each epoch.
  void SetEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch, num_samples() of them.
  std::vector<int64_t> Indices() const;

  // Samples per rank in this division of the epoch, and across all ranks.
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * options_.world_size; }

 private:
  explicit DistributedSampler(SamplerOptions options);

  SamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DATA_DISTRIBUTED_SAMPLER_H_
