#include "worker/trainer/params_io.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// Parameters and buffers by dotted name.
std::vector<std::pair<std::string, torch::Tensor>> NamedState(
    const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& item : module.named_parameters()) {
    state.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers()) {
    state.emplace_back(item.key(), item.value());
  }
  return state;
}

}  // namespace

absl::Status SaveParameters(const torch::nn::Module& module,
                            const std::string& path) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, tensor] : NamedState(module)) {
    dict.insert(name, tensor.detach().to(torch::kCPU).contiguous());
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    return absl::InternalError(absl::StrCat("cannot write parameters to ",
                                            path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, torch::Tensor>> ReadParameters(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open parameter file ", path));
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(
        path, " is not a saved dict of tensors: ", e.what_without_backtrace()));
  }
  if (!value.isGenericDict()) {
    return absl::DataLossError(absl::StrCat(
        path, " holds a ", value.tagKind(), ", not a dict of tensors"));
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return absl::DataLossError(absl::StrCat(
          path, " has an entry that is not name -> tensor"));
    }
    tensors.emplace(entry.key().toStringRef(), entry.value().toTensor());
  }
  return tensors;
}

absl::Status LoadParameters(torch::nn::Module& module,
                            const std::string& path) {
  auto tensors = ReadParameters(path);
  if (!tensors.ok()) return tensors.status();
  const auto state = NamedState(module);
  for (const auto& [name, target] : state) {
    auto it = tensors->find(name);
    if (it == tensors->end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " has no '", name, "'"));
    }
    if (it->second.sizes() != target.sizes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": '", name, "' has shape ", c10::str(it->second.sizes()),
          ", the model wants ", c10::str(target.sizes())));
    }
  }
  if (tensors->size() != state.size()) {
    for (const auto& [name, tensor] : *tensors) {
      bool known = false;
      for (const auto& entry : state) known = known || entry.first == name;
      if (!known) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, " has '", name, "', which the model does not"));
      }
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : state) {
    torch::Tensor copy = target;
    copy.copy_(tensors->at(name));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
