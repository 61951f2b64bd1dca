#include "worker/ddp/replica_fingerprint.h"

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/ddp/torch_compat.h"

namespace gradsync {
namespace {

// The tensor's elements as integers of their own size.
torch::ScalarType BitsType(const torch::Tensor& t) {
  switch (t.element_size()) {
    case 1:
      return torch::kUInt8;
    case 2:
      return torch::kInt16;
    case 4:
      return torch::kInt32;
    default:
      return torch::kInt64;
  }
}

// The sum of `t`'s bit patterns, as a one-element int64 tensor on its
// device (not synchronized).
torch::Tensor BitSum(const torch::Tensor& t) {
  torch::Tensor c = t.detach().contiguous();
  if (c.numel() == 0) return torch::zeros({1}, c.options().dtype(torch::kInt64));
  // Summed in the elements' own width (wrapping: a flipped bit still
  // changes it), which vectorizes; widened to int64 after.
  const torch::ScalarType bits = BitsType(c);
  return c.view(bits).sum(bits).to(torch::kInt64).reshape({1});
}

// The optimizer's state tensors of `param`, named after it.
void AddOptimizerState(const torch::optim::Optimizer& optimizer,
                       const std::string& name, const torch::Tensor& param,
                       std::vector<std::string>* names,
                       std::vector<torch::Tensor>* sums) {
  const torch::optim::OptimizerParamState* state = FindOptimizerState(optimizer, param);
  if (state == nullptr) return;
  auto add = [&](const char* what, const torch::Tensor& t) {
    if (!t.defined()) return;
    names->push_back(absl::StrCat(name, ":", what));
    sums->push_back(BitSum(t));
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
  try {
    torch::NoGradGuard no_grad;
    ReplicaDigest digest;
    std::vector<std::string> state_names;
    std::vector<torch::Tensor> sums, state_sums;
    for (const auto& item : model.named_parameters()) {
      digest.names.push_back(item.key());
      sums.push_back(BitSum(item.value()));
      AddOptimizerState(optimizer, item.key(), item.value(), &state_names,
                        &state_sums);
    }
    digest.names.insert(digest.names.end(), state_names.begin(),
                        state_names.end());
    sums.insert(sums.end(), state_sums.begin(), state_sums.end());
    if (sums.empty()) return digest;
    // One copy to the host when the tensors share a device.
    bool one_device = true;
    for (const torch::Tensor& s : sums) {
      one_device = one_device && s.device() == sums[0].device();
    }
    if (!one_device) {
      for (torch::Tensor& s : sums) s = s.to(torch::kCPU);
    }
    torch::Tensor all = torch::cat(sums).to(torch::kCPU);
    const int64_t* p = all.data_ptr<int64_t>();
    digest.values.assign(p, p + all.numel());
    return digest;
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
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
