#include "worker/ddp/replica_fingerprint.h"

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/ddp/tensor_digest.h"
#include "worker/ddp/torch_compat.h"

namespace gradsync {
namespace {

// The optimizer's state tensors of `param`, named after it.
void AddOptimizerState(const torch::optim::Optimizer& optimizer,
                       const std::string& name, const torch::Tensor& param,
                       std::vector<std::string>* names,
                       std::vector<torch::Tensor>* tensors) {
  const torch::optim::OptimizerParamState* state = FindOptimizerState(optimizer, param);
  if (state == nullptr) return;
  auto add = [&](const char* what, const torch::Tensor& t) {
    if (!t.defined()) return;
    names->push_back(absl::StrCat(name, ":", what));
    tensors->push_back(t);
  };
  if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
    add("momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
    add("exp_avg", s->exp_avg());
    add("exp_avg_sq", s->exp_avg_sq());
    add("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
    add("exp_avg", s->exp_avg());
    add("exp_avg_sq", s->exp_avg_sq());
    add("max_exp_avg_sq", s->max_exp_avg_sq());
  }
}

}  // namespace

absl::StatusOr<ReplicaDigest> FingerprintReplica(
    const torch::nn::Module& model, const torch::optim::Optimizer& optimizer) {
  std::vector<std::string> names, state_names;
  std::vector<torch::Tensor> tensors, state_tensors;
  try {
    for (const auto& item : model.named_parameters()) {
      names.push_back(item.key());
      tensors.push_back(item.value());
      AddOptimizerState(optimizer, item.key(), item.value(), &state_names,
                        &state_tensors);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
  names.insert(names.end(), state_names.begin(), state_names.end());
  tensors.insert(tensors.end(), state_tensors.begin(), state_tensors.end());
  return DigestTensors(std::move(names), tensors);
}

absl::Status FlipOneParameterBit(torch::nn::Module& model) {
  try {
    torch::NoGradGuard no_grad;
    for (torch::Tensor p : model.parameters()) {
      if (p.numel() == 0 || p.element_size() != 4) continue;
      torch::Tensor bits = p.view(torch::kInt32).view({-1}).narrow(0, 0, 1);
      bits.bitwise_xor_(1 << 20);
      return absl::OkStatus();
    }
    return absl::InternalError("the model has no float32 parameter to corrupt");
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace gradsync
