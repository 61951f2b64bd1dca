#include "worker/data/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<DistributedSampler> DistributedSampler::Create(
    SamplerOptions options) {
  if (options.dataset_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset size ", options.dataset_size, " is negative"));
  }
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", options.world_size, " is below 1"));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is outside [0, ",
                     options.world_size, ")"));
  }
  if (options.start < 0 || options.start > options.dataset_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("start ", options.start, " is outside [0, ",
                     options.dataset_size, "]"));
  }
  return DistributedSampler(options);
}

DistributedSampler::DistributedSampler(SamplerOptions options)
    : options_(options) {
  const int64_t n = options_.dataset_size - options_.start;
  const int64_t w = options_.world_size;
  // PyTorch: ceil((n - w) / w) when dropping an uneven tail, else ceil(n / w).
  if (options_.drop_last && n % w != 0) {
    num_samples_ = n < w ? 0 : (n - w + w - 1) / w;
  } else {
    num_samples_ = (n + w - 1) / w;
  }
}

std::vector<int64_t> DistributedSampler::Indices() const {
  const int64_t n = options_.dataset_size;
  std::vector<int64_t> indices(n);
  if (options_.shuffle) {
    at::Generator generator =
        at::detail::createCPUGenerator(options_.seed + epoch_);
    torch::Tensor permutation =
        torch::randperm(n, generator, torch::TensorOptions(torch::kInt64));
    const int64_t* p = permutation.data_ptr<int64_t>();
    std::copy(p, p + n, indices.begin());
  } else {
    std::iota(indices.begin(), indices.end(), int64_t{0});
  }
  indices.erase(indices.begin(), indices.begin() + options_.start);
  const int64_t n_rest = n - options_.start;
  const int64_t total = total_size();
  if (total > n_rest) {
    // Pad by repeating the list from its start (as often as needed).
    for (int64_t i = n_rest; i < total; ++i) {
      indices.push_back(indices[i - n_rest]);
    }
  } else {
    indices.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = options_.rank; i < total; i += options_.world_size) {
    mine.push_back(indices[i]);
  }
  return mine;
}

}  // namespace gradsync
