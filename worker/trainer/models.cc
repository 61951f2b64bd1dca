#include "worker/trainer/models.h"

#include <torch/torch.h>

#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/ddp/sync_batch_norm.h"

namespace gradsync {
namespace {

namespace nn = torch::nn;

nn::Sequential Mlp(int hidden) {
  return nn::Sequential({{"flatten", nn::Flatten()},
                         {"fc1", nn::Linear(28 * 28, hidden)},
                         {"relu1", nn::ReLU()},
                         {"fc2", nn::Linear(hidden, hidden)},
                         {"relu2", nn::ReLU()},
                         {"fc3", nn::Linear(hidden, 10)}});
}

nn::Conv2d Conv5x5(int in, int out) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 5).padding(2));
}

nn::Sequential Cnn(int hidden) {
  return nn::Sequential({{"conv1", Conv5x5(1, 16)},
                         {"relu1", nn::ReLU()},
                         {"pool1", nn::MaxPool2d(2)},
                         {"conv2", Conv5x5(16, 32)},
                         {"relu2", nn::ReLU()},
                         {"pool2", nn::MaxPool2d(2)},
                         {"flatten", nn::Flatten()},
                         {"fc1", nn::Linear(32 * 7 * 7, hidden)},
                         {"relu3", nn::ReLU()},
                         {"fc2", nn::Linear(hidden, 10)}});
}

nn::Sequential CnnBn(int hidden) {
  return nn::Sequential({{"conv1", Conv5x5(1, 16)},
                         {"bn1", nn::BatchNorm2d(16)},
                         {"relu1", nn::ReLU()},
                         {"pool1", nn::MaxPool2d(2)},
                         {"conv2", Conv5x5(16, 32)},
                         {"bn2", nn::BatchNorm2d(32)},
                         {"relu2", nn::ReLU()},
                         {"pool2", nn::MaxPool2d(2)},
                         {"flatten", nn::Flatten()},
                         {"fc1", nn::Linear(32 * 7 * 7, hidden)},
                         {"bn3", nn::BatchNorm1d(hidden)},
                         {"relu3", nn::ReLU()},
                         {"fc2", nn::Linear(hidden, 10)}});
}

// A Sequential that another Sequential can hold: LibTorch's Sequential has a
// template forward(), which Sequential::push_back cannot wrap.
class LayerImpl : public nn::SequentialImpl {
 public:
  torch::Tensor forward(torch::Tensor x) {
    return SequentialImpl::forward(std::move(x));
  }
};
TORCH_MODULE(Layer);

// A convolution without bias, as ResNets have (batch norm follows), padded
// to keep the size at stride 1.
nn::Conv2d ResNetConv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel)
                        .stride(stride)
                        .padding(kernel / 2)
                        .bias(false));
}

struct ConvSpec {
  int64_t in, out, kernel, stride;
};

// The convolutions of a residual block: torchvision's BasicBlock (3x3, 3x3)
// or Bottleneck (1x1, 3x3, 1x1 with 4x the channels), striding in the 3x3.
std::vector<ConvSpec> BlockConvs(int64_t in, int64_t planes, int64_t stride,
                                 bool bottleneck) {
  if (bottleneck) {
    return {{in, planes, 1, 1}, {planes, planes, 3, stride},
            {planes, 4 * planes, 1, 1}};
  }
  return {{in, planes, 3, stride}, {planes, planes, 3, 1}};
}

// torchvision's BasicBlock or Bottleneck: convs conv1, conv2[, conv3], each
// followed by its batch norm (bn1, bn2[, bn3]) and all but the last by a
// ReLU; the input, through `downsample` (a 1x1 conv "0" and a batch norm
// "1") where the shape changes, is added before the final ReLU. The batch
// norms are only registered and called by name (ForwardBatchNorm), so
// ConvertSyncBatchNorm can swap them.
class ResidualBlockImpl : public nn::Module {
 public:
  ResidualBlockImpl(int64_t in, int64_t planes, int64_t stride,
                    bool bottleneck) {
    const std::vector<ConvSpec> specs =
        BlockConvs(in, planes, stride, bottleneck);
    for (size_t i = 0; i < specs.size(); ++i) {
      const ConvSpec& s = specs[i];
      convs_.push_back(
          register_module(absl::StrCat("conv", i + 1),
                          ResNetConv(s.in, s.out, s.kernel, s.stride)));
      register_module(BatchNormName(i), nn::BatchNorm2d(s.out));
    }
    const int64_t out = specs.back().out;
    if (stride != 1 || in != out) {
      downsample_ = register_module(
          "downsample", nn::Sequential({{"0", ResNetConv(in, out, 1, stride)},
                                        {"1", nn::BatchNorm2d(out)}}));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor out = x;
    for (size_t i = 0; i < convs_.size(); ++i) {
      out = ForwardBatchNorm(*this, BatchNormName(i), convs_[i](out));
      if (i + 1 < convs_.size()) out = torch::relu(out);
    }
    torch::Tensor identity =
        downsample_.is_empty() ? x : downsample_->forward(x);
    return torch::relu(out + identity);
  }

 private:
  static std::string BatchNormName(size_t i) {
    return absl::StrCat("bn", i + 1);
  }

  std::vector<nn::Conv2d> convs_;
  nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(ResidualBlock);

// torchvision's _make_layer: `blocks` blocks of `planes`, the first striding
// by `stride`; `*channels` goes from the layer's input channels to its
// output's.
Layer ResNetLayer(int64_t* channels, int64_t planes, int blocks,
                  int64_t stride, bool bottleneck) {
  Layer layer;
  for (int i = 0; i < blocks; ++i) {
    layer->push_back(std::to_string(i),
                     ResidualBlock(*channels, planes, i == 0 ? stride : 1,
                                   bottleneck));
    *channels = planes * (bottleneck ? 4 : 1);
  }
  return layer;
}

// torchvision's ResNet(block, depths, num_classes=10), initialized as it
// does: kaiming_normal_(fan_out, relu) for the convs, batch norms at weight
// 1 and bias 0 (LibTorch's default), Linear's default for fc.
nn::Sequential ResNet(const std::array<int, 4>& depths, bool bottleneck) {
  nn::Sequential net;
  net->push_back("conv1", ResNetConv(3, 64, 7, 2));
  net->push_back("bn1", nn::BatchNorm2d(64));
  net->push_back("relu", nn::ReLU());
  net->push_back("maxpool", nn::MaxPool2d(
                                nn::MaxPool2dOptions(3).stride(2).padding(1)));
  int64_t channels = 64;
  for (int i = 0; i < 4; ++i) {
    net->push_back(absl::StrCat("layer", i + 1),
                   ResNetLayer(&channels, int64_t{64} << i, depths[i],
                               i == 0 ? 1 : 2, bottleneck));
  }
  net->push_back("avgpool", nn::AdaptiveAvgPool2d(1));
  net->push_back("flatten", nn::Flatten());
  net->push_back("fc", nn::Linear(channels, 10));
  for (const auto& module : net->modules()) {
    if (auto* conv = module->as<nn::Conv2dImpl>()) {
      nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut,
                                torch::kReLU);
    }
  }
  return net;
}

// A kind of model MakeModel builds.
struct ModelKind {
  const char* name;  // --model
  std::vector<int64_t> input_shape;  // ModelInputShape
  bool uses_hidden;  // whether `make` reads --hidden
  nn::Sequential (*make)(int hidden);
};

// Every kind, in the order the error for an unknown one lists them.
const std::vector<ModelKind>& ModelKinds() {
  static const auto* kinds = new std::vector<ModelKind>{
      {"mlp", {1, 28, 28}, true, Mlp},
      {"cnn", {1, 28, 28}, true, Cnn},
      {"cnn_bn", {1, 28, 28}, true, CnnBn},
      {"resnet18", {3, 32, 32}, false,
       [](int) { return ResNet({2, 2, 2, 2}, /*bottleneck=*/false); }},
      {"resnet50", {3, 32, 32}, false,
       [](int) { return ResNet({3, 4, 6, 3}, /*bottleneck=*/true); }},
  };
  return *kinds;
}

// The kind named `name`, or nullptr.
const ModelKind* FindModelKind(const std::string& name) {
  for (const ModelKind& kind : ModelKinds()) {
    if (name == kind.name) return &kind;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<torch::nn::Sequential> MakeModel(const ModelConfig& config) {
  const ModelKind* kind = FindModelKind(config.kind);
  if (kind == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model must be one of ",
        absl::StrJoin(ModelKinds(), ", ",
                      [](std::string* out, const ModelKind& k) {
                        out->append(k.name);
                      }),
        "; got '", config.kind, "'"));
  }
  if (kind->uses_hidden && config.hidden < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hidden must be at least 1 for --model ", kind->name, ", got ",
        config.hidden));
  }
  return kind->make(config.hidden);
}

std::vector<int64_t> ModelInputShape(const ModelConfig& config) {
  const ModelKind* kind = FindModelKind(config.kind);
  return kind != nullptr ? kind->input_shape : std::vector<int64_t>{};
}

}  // namespace gradsync
