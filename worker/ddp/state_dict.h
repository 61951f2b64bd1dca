// A module's state (parameters and buffers by dotted name, "fc1.weight"),
// as PyTorch's state_dict, in memory and on disk. Files are a dict name ->
// tensor written with torch::pickle_save, so Python's torch.load reads them,
// and files Python wrote with torch.save of a state dict (a model's, or a
// DDP model's with "module." names) load here.
#ifndef GRADSYNC_WORKER_DDP_STATE_DICT_H_
#define GRADSYNC_WORKER_DDP_STATE_DICT_H_

#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsync {

using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

// The prefix PyTorch's DistributedDataParallel puts on its module's names.
inline constexpr char kDdpPrefix[] = "module.";

// `module`'s parameters then buffers (the tensors themselves, not copies),
// each name preceded by `prefix`.
StateDict GetStateDict(const torch::nn::Module& module,
                       const std::string& prefix = "");

// `state` without `prefix` on its names when every name has it, otherwise
// `state` as it is (PyTorch's consume_prefix_in_state_dict_if_present).
StateDict ConsumePrefix(const StateDict& state, const std::string& prefix);

// Copies `state` into `module`'s parameters and buffers of the same names,
// after dropping a "module." prefix that every name carries (a DDP
// model's). Every name must match both ways, with the same shape:
// otherwise FAILED_PRECONDITION naming the first missing, extra or
// differently shaped entry, and nothing is changed. Values are converted to
// each target's dtype and device.
absl::Status LoadStateDict(torch::nn::Module& module, const StateDict& state);

// Writes `state` as CPU tensors to `path` (replacing it). INTERNAL naming
// the path when it cannot be written.
absl::Status WriteStateDict(const StateDict& state, const std::string& path);

// Reads a file WriteStateDict or torch.save of a dict of tensors (a state
// dict) wrote, in its order. NOT_FOUND for a missing file, DATA_LOSS for one
// that is not such a dict.
absl::StatusOr<StateDict> ReadStateDict(const std::string& path);

// WriteStateDict(GetStateDict(module)), and LoadStateDict from a file.
absl::Status SaveParameters(const torch::nn::Module& module,
                            const std::string& path);
absl::Status LoadParameters(torch::nn::Module& module, const std::string& path);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_STATE_DICT_H_
