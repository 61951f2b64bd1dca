#include "worker/ddp/state_dict.h"

#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/ddp/torch_file.h"

namespace gradsync {

StateDict GetStateDict(const torch::nn::Module& module,
                       const std::string& prefix) {
  StateDict state;
  for (const auto& item : module.named_parameters()) {
    state.insert(prefix + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers()) {
    state.insert(prefix + item.key(), item.value());
  }
  return state;
}

StateDict ConsumePrefix(const StateDict& state, const std::string& prefix) {
  if (state.is_empty()) return state;
  for (const auto& item : state) {
    if (!absl::StartsWith(item.key(), prefix)) return state;
  }
  StateDict stripped;
  for (const auto& item : state) {
    stripped.insert(item.key().substr(prefix.size()), item.value());
  }
  return stripped;
}

absl::Status LoadStateDict(torch::nn::Module& module, const StateDict& state) {
  const StateDict given = ConsumePrefix(state, kDdpPrefix);
  const StateDict targets = GetStateDict(module);
  for (const auto& target : targets) {
    const torch::Tensor* value = given.find(target.key());
    if (value == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("the state has no '", target.key(), "'"));
    }
    if (value->sizes() != target.value().sizes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", target.key(), "' has shape ", c10::str(value->sizes()),
          " in the state, the model wants ", c10::str(target.value().sizes())));
    }
  }
  for (const auto& item : given) {
    if (!targets.contains(item.key())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the state has '", item.key(), "', which the model does not"));
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& target : targets) {
    torch::Tensor copy = target.value();
    copy.copy_(given[target.key()]);
  }
  return absl::OkStatus();
}

absl::Status WriteStateDict(const StateDict& state, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& item : state) {
    dict.insert(item.key(), item.value().detach().to(torch::kCPU).contiguous());
  }
  return WriteTorchFile(c10::IValue(dict), path);
}

absl::StatusOr<StateDict> ReadStateDict(const std::string& path) {
  GS_ASSIGN_OR_RETURN(c10::IValue value, ReadTorchFile(path));
  if (!value.isGenericDict()) {
    return absl::DataLossError(absl::StrCat(
        path, " holds a ", value.tagKind(), ", not a dict of tensors"));
  }
  StateDict state;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return absl::DataLossError(absl::StrCat(
          path, " has an entry that is not name -> tensor"));
    }
    state.insert(entry.key().toStringRef(), entry.value().toTensor());
  }
  return state;
}

absl::Status SaveParameters(const torch::nn::Module& module,
                            const std::string& path) {
  return WriteStateDict(GetStateDict(module), path);
}

absl::Status LoadParameters(torch::nn::Module& module,
                            const std::string& path) {
  absl::StatusOr<StateDict> state = ReadStateDict(path);
  if (!state.ok()) return state.status();
  absl::Status loaded = LoadStateDict(module, *state);
  if (!loaded.ok()) {
    return absl::Status(loaded.code(),
                        absl::StrCat(path, ": ", loaded.message()));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
