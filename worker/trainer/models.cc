#include "worker/trainer/models.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<torch::nn::Sequential> MakeModel(const ModelConfig& config) {
  namespace nn = torch::nn;
  if (config.hidden < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hidden must be at least 1, got ", config.hidden));
  }
  const int h = config.hidden;
  if (config.kind == "mlp") {
    return nn::Sequential({{"flatten", nn::Flatten()},
                           {"fc1", nn::Linear(28 * 28, h)},
                           {"relu1", nn::ReLU()},
                           {"fc2", nn::Linear(h, h)},
                           {"relu2", nn::ReLU()},
                           {"fc3", nn::Linear(h, 10)}});
  }
  if (config.kind == "cnn") {
    auto conv = [](int in, int out) {
      return nn::Conv2d(nn::Conv2dOptions(in, out, 5).padding(2));
    };
    return nn::Sequential({{"conv1", conv(1, 16)},
                           {"relu1", nn::ReLU()},
                           {"pool1", nn::MaxPool2d(2)},
                           {"conv2", conv(16, 32)},
                           {"relu2", nn::ReLU()},
                           {"pool2", nn::MaxPool2d(2)},
                           {"flatten", nn::Flatten()},
                           {"fc1", nn::Linear(32 * 7 * 7, h)},
                           {"relu3", nn::ReLU()},
                           {"fc2", nn::Linear(h, 10)}});
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--model must be mlp or cnn, got '", config.kind, "'"));
}

}  // namespace gradsync
