// The reference trainer's models, as PyTorch would name them: an MLP with
// modules fc1, fc2, fc3 and a small CNN, both over 28x28 one-channel images
// with 10 classes.
#ifndef GRADSYNC_WORKER_TRAINER_MODELS_H_
#define GRADSYNC_WORKER_TRAINER_MODELS_H_

#include <torch/nn/modules/container/sequential.h>

#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

struct ModelConfig {
  // "mlp" or "cnn".
  std::string kind = "mlp";
  // mlp: the width of both hidden layers; cnn: the width of fc1.
  int hidden = 128;
};

// mlp: flatten, fc1 = Linear(784, hidden), ReLU, fc2 = Linear(hidden,
// hidden), ReLU, fc3 = Linear(hidden, 10).
// cnn: conv1 = Conv2d(1, 16, 5, padding 2), ReLU, 2x2 max-pool, conv2 =
// Conv2d(16, 32, 5, padding 2), ReLU, 2x2 max-pool, flatten, fc1 =
// Linear(1568, hidden), ReLU, fc2 = Linear(hidden, 10).
// Parameters are initialized from LibTorch's global generator (seed it
// first). INVALID_ARGUMENT for an unknown kind or hidden < 1.
absl::StatusOr<torch::nn::Sequential> MakeModel(const ModelConfig& config);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TRAINER_MODELS_H_
