// The reference trainer's models, named as PyTorch names them: an MLP and two
// small CNNs over 28x28 one-channel images, and torchvision's ResNet-18 and
// ResNet-50 over 32x32 RGB images (CIFAR-10), all with 10 classes.
#ifndef GRADSYNC_WORKER_TRAINER_MODELS_H_
#define GRADSYNC_WORKER_TRAINER_MODELS_H_

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsync {

struct ModelConfig {
  // "mlp", "cnn", "cnn_bn", "resnet18" or "resnet50".
  std::string kind = "mlp";
  // mlp: the width of both hidden layers; cnn and cnn_bn: the width of fc1;
  // unused by the resnets.
  int hidden = 128;
};

// mlp: flatten, fc1 = Linear(784, hidden), ReLU, fc2 = Linear(hidden,
// hidden), ReLU, fc3 = Linear(hidden, 10).
// cnn: conv1 = Conv2d(1, 16, 5, padding 2), ReLU, 2x2 max-pool, conv2 =
// Conv2d(16, 32, 5, padding 2), ReLU, 2x2 max-pool, flatten, fc1 =
// Linear(1568, hidden), ReLU, fc2 = Linear(hidden, 10).
// cnn_bn: cnn with bn1 = BatchNorm2d(16) after conv1, bn2 = BatchNorm2d(32)
// after conv2 and bn3 = BatchNorm1d(hidden) after fc1, each before its ReLU
// (small, for tests of SyncBatchNorm).
// resnet18, resnet50: torchvision 0.14's resnet18(num_classes=10) and
// resnet50(num_classes=10) (BasicBlocks [2, 2, 2, 2]; Bottlenecks [3, 4, 6,
// 3] striding in their 3x3 conv), with its children (conv1, bn1, relu,
// maxpool, layer1..layer4 of blocks "0", "1", ..., avgpool, flatten, fc) and
// initialization, so state dicts move between the two. Their blocks call
// their batch norms by name, so ConvertSyncBatchNorm swaps them all.
// Parameters are initialized from LibTorch's global generator (seed it
// first). INVALID_ARGUMENT for an unknown kind, or hidden < 1 for the kinds
// that use it.
absl::StatusOr<torch::nn::Sequential> MakeModel(const ModelConfig& config);

// The shape of one input of `config.kind`'s model, [channels, height,
// width]: {1, 28, 28} for mlp, cnn and cnn_bn; {3, 32, 32} for the resnets
// (which accept other sizes too: they pool adaptively); empty for a kind
// MakeModel rejects.
std::vector<int64_t> ModelInputShape(const ModelConfig& config);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TRAINER_MODELS_H_
