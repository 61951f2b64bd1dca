// DistributedSampler as a LibTorch torch::data sampler, so that
// torch::data::make_data_loader(dataset, sampler, options) gives each rank
// the batches PyTorch's DataLoader(dataset, sampler=DistributedSampler(...))
// gives it, index for index:
//
//   auto sampler = TorchDistributedSampler::Create(options);  // StatusOr
//   auto loader = torch::data::make_data_loader(dataset, *sampler,
//                                               DataLoaderOptions(32));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler->set_epoch(epoch);           // PyTorch's sampler.set_epoch
//     for (auto& batch : *loader) { ... }  // begin() calls reset()
//   }
#ifndef GRADSYNC_WORKER_DATA_TORCH_SAMPLER_H_
#define GRADSYNC_WORKER_DATA_TORCH_SAMPLER_H_

#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/distributed_sampler.h"

namespace gradsync {

// Yields this rank's indices of the epoch (DistributedSampler::Indices, as
// size_t) in batches.
//
// A handle: copies share one state (epoch, index list, position), because
// make_data_loader keeps its own copy of the sampler and offers no way back
// to it. Keep a copy to call set_epoch, save or load on; they act on the
// loader's copy, as PyTorch's calls act on the sampler its DataLoader holds.
//
// The interface LibTorch defines (reset, next, save, load) cannot return a
// status: its errors throw c10::Error, as LibTorch's own samplers do.
// Thread-safe (one mutex per shared state). The DataLoader asks for batches
// from the thread that iterates it; with workers > 0 it asks up to
// max_jobs batches ahead of the one being consumed, so index() and save()
// count batches handed to the loader, not batches consumed: use workers = 0
// (or save at epoch ends) when the saved position must be exact.
class TorchDistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  // INVALID_ARGUMENT for options DistributedSampler refuses (a negative
  // dataset size, a world size below 1, a rank outside [0, world_size), a
  // start outside [0, dataset_size]). Ready at epoch 0, position 0.
  static absl::StatusOr<TorchDistributedSampler> Create(SamplerOptions options);

  // PyTorch's set_epoch: the epoch whose order the next reset() (which a
  // DataLoader's begin() calls) deals; the running epoch is left alone.
  void set_epoch(int64_t epoch);
  // The epoch set_epoch chose (the running one unless set since reset()).
  int64_t epoch() const;

  // Restarts the epoch: this rank's index list for epoch(), from its first
  // index. `new_size` (LibTorch passes it when the dataset changed size)
  // replaces SamplerOptions::dataset_size; c10::Error if the options are
  // then invalid (start beyond the new size). Right after load(), and for
  // the loaded epoch, keeps the loaded position instead, once, so that a
  // loader over a loaded sampler resumes mid-epoch.
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;

  // The next min(batch_size, remaining) indices of this rank's epoch;
  // nullopt once all num_samples() were handed out. c10::Error for a
  // batch_size of 0.
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;

  // Writes the running epoch, the position in it and the options that
  // define its index list. Read it back with load() (or torch::save and
  // torch::load, which call these).
  void save(torch::serialize::OutputArchive& archive) const override;
  // Restores the epoch and position save() wrote; the next reset() keeps
  // them (see reset). c10::Error, leaving this sampler unchanged, when the
  // archive lacks a key or was saved with other options (another rank,
  // world size, dataset size, seed, ...: the position would mean other
  // samples).
  void load(torch::serialize::InputArchive& archive) override;

  // Indices handed out so far in the running epoch.
  size_t index() const;
  // This rank's indices per epoch (DistributedSampler::num_samples).
  size_t num_samples() const;

 private:
  struct State;
  explicit TorchDistributedSampler(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;  // never null
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DATA_TORCH_SAMPLER_H_
