// Model parameters on disk: a dict name -> tensor written with
// torch::pickle_save, so Python's torch.load reads it (and files Python
// wrote with torch.save of such a dict load here).
#ifndef GRADSYNC_WORKER_TRAINER_PARAMS_IO_H_
#define GRADSYNC_WORKER_TRAINER_PARAMS_IO_H_

#include <torch/nn/module.h>

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsync {

// Writes `module`'s parameters and buffers as CPU tensors under their dotted
// names ("fc1.weight"). INTERNAL naming the path when it cannot be written.
absl::Status SaveParameters(const torch::nn::Module& module,
                            const std::string& path);

// Reads a file SaveParameters (or torch.save of a dict of tensors) wrote.
// NOT_FOUND for a missing file, DATA_LOSS for one that is not such a dict.
absl::StatusOr<std::map<std::string, torch::Tensor>> ReadParameters(
    const std::string& path);

// Copies the file's tensors into `module`'s parameters and buffers of the
// same names. FAILED_PRECONDITION naming the first missing, extra or
// differently shaped entry.
absl::Status LoadParameters(torch::nn::Module& module, const std::string& path);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TRAINER_PARAMS_IO_H_
