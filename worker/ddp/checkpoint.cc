#include "worker/ddp/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/ddp/torch_compat.h"
#include "worker/ddp/torch_file.h"

namespace gradsync {
namespace {

using GenericDict = c10::impl::GenericDict;

GenericDict NewDict(c10::TypePtr key = c10::StringType::get()) {
  return GenericDict(std::move(key), c10::AnyType::get());
}

enum class Kind { kSgd, kAdam, kAdamW };

absl::StatusOr<Kind> KindOf(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return Kind::kSgd;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return Kind::kAdam;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return Kind::kAdamW;
  return absl::UnimplementedError(
      "checkpoints hold SGD, Adam and AdamW optimizer state; this optimizer "
      "is none of them");
}

torch::Tensor Cpu(const torch::Tensor& t) { return t.detach().to(torch::kCPU).clone(); }

// One parameter's state as PyTorch keys it.
GenericDict ParamStateDict(Kind kind,
                           const torch::optim::OptimizerParamState& state) {
  GenericDict out = NewDict();
  if (kind == Kind::kSgd) {
    const auto& s = static_cast<const torch::optim::SGDParamState&>(state);
    out.insert("momentum_buffer", s.momentum_buffer().defined()
                                      ? c10::IValue(Cpu(s.momentum_buffer()))
                                      : c10::IValue());
    return out;
  }
  auto fill = [&](const auto& s) {
    // PyTorch 1.13's Adam keeps the step as a float tensor.
    out.insert("step", torch::tensor(static_cast<double>(s.step()), torch::kFloat32));
    out.insert("exp_avg", Cpu(s.exp_avg()));
    out.insert("exp_avg_sq", Cpu(s.exp_avg_sq()));
    if (s.max_exp_avg_sq().defined()) {
      out.insert("max_exp_avg_sq", Cpu(s.max_exp_avg_sq()));
    }
  };
  if (kind == Kind::kAdam) {
    fill(static_cast<const torch::optim::AdamParamState&>(state));
  } else {
    fill(static_cast<const torch::optim::AdamWParamState&>(state));
  }
  return out;
}

GenericDict GroupDict(Kind kind, const torch::optim::OptimizerOptions& options) {
  GenericDict out = NewDict();
  if (kind == Kind::kSgd) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
    out.insert("lr", o.lr());
    out.insert("momentum", o.momentum());
    out.insert("dampening", o.dampening());
    out.insert("weight_decay", o.weight_decay());
    out.insert("nesterov", o.nesterov());
    return out;
  }
  auto fill = [&](const auto& o) {
    out.insert("lr", o.lr());
    out.insert("betas", c10::ivalue::Tuple::create(
                            {std::get<0>(o.betas()), std::get<1>(o.betas())}));
    out.insert("eps", o.eps());
    out.insert("weight_decay", o.weight_decay());
    out.insert("amsgrad", o.amsgrad());
  };
  if (kind == Kind::kAdam) {
    fill(static_cast<const torch::optim::AdamOptions&>(options));
  } else {
    fill(static_cast<const torch::optim::AdamWOptions&>(options));
  }
  return out;
}

// `dict[key]` when present, else nullptr.
const c10::IValue* Find(const GenericDict& dict, const c10::IValue& key) {
  auto it = dict.find(key);
  return it == dict.end() ? nullptr : &it->value();
}

absl::StatusOr<double> Number(const GenericDict& dict, const char* key) {
  const c10::IValue* v = Find(dict, std::string(key));
  if (v == nullptr) return absl::FailedPreconditionError(absl::StrCat("no '", key, "'"));
  if (v->isDouble()) return v->toDouble();
  if (v->isInt()) return static_cast<double>(v->toInt());
  if (v->isBool()) return v->toBool() ? 1.0 : 0.0;
  if (v->isTensor() && v->toTensor().numel() == 1) {
    return v->toTensor().item<double>();
  }
  return absl::FailedPreconditionError(absl::StrCat("'", key, "' is not a number"));
}

// A tensor entry of `dict` checked against `like`'s shape, on its device.
absl::StatusOr<torch::Tensor> TensorLike(const GenericDict& dict, const char* key,
                                         const torch::Tensor& like) {
  const c10::IValue* v = Find(dict, std::string(key));
  if (v == nullptr || !v->isTensor()) {
    return absl::FailedPreconditionError(absl::StrCat("no tensor '", key, "'"));
  }
  const torch::Tensor& t = v->toTensor();
  if (t.sizes() != like.sizes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", key, "' has shape ", c10::str(t.sizes()), ", the parameter ",
        c10::str(like.sizes())));
  }
  return t.to(like.device(), like.scalar_type()).clone();
}

// The state `entry` describes for `param`.
absl::StatusOr<std::unique_ptr<torch::optim::OptimizerParamState>> ParseParamState(
    Kind kind, const GenericDict& entry, const torch::Tensor& param) {
  if (kind == Kind::kSgd) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    const c10::IValue* buffer = Find(entry, std::string("momentum_buffer"));
    if (buffer != nullptr && !buffer->isNone()) {
      GS_ASSIGN_OR_RETURN(torch::Tensor t, TensorLike(entry, "momentum_buffer", param));
      state->momentum_buffer(t);
    }
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
  }
  auto fill = [&](auto state) -> absl::StatusOr<std::unique_ptr<torch::optim::OptimizerParamState>> {
    GS_ASSIGN_OR_RETURN(double step, Number(entry, "step"));
    GS_ASSIGN_OR_RETURN(torch::Tensor exp_avg, TensorLike(entry, "exp_avg", param));
    GS_ASSIGN_OR_RETURN(torch::Tensor exp_avg_sq, TensorLike(entry, "exp_avg_sq", param));
    state->step(static_cast<int64_t>(step));
    state->exp_avg(exp_avg);
    state->exp_avg_sq(exp_avg_sq);
    if (Find(entry, std::string("max_exp_avg_sq")) != nullptr) {
      GS_ASSIGN_OR_RETURN(torch::Tensor max, TensorLike(entry, "max_exp_avg_sq", param));
      state->max_exp_avg_sq(max);
    }
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
  };
  if (kind == Kind::kAdam) return fill(std::make_unique<torch::optim::AdamParamState>());
  return fill(std::make_unique<torch::optim::AdamWParamState>());
}

// Applies a group's hyperparameters from `dict` (those present) to `options`.
absl::Status ApplyGroup(Kind kind, const GenericDict& dict,
                        torch::optim::OptimizerOptions& options) {
  auto number = [&](const char* key, auto setter) -> absl::Status {
    if (Find(dict, std::string(key)) == nullptr) return absl::OkStatus();
    GS_ASSIGN_OR_RETURN(double v, Number(dict, key));
    setter(v);
    return absl::OkStatus();
  };
  if (kind == Kind::kSgd) {
    auto& o = static_cast<torch::optim::SGDOptions&>(options);
    GS_RETURN_IF_ERROR(number("lr", [&](double v) { o.lr(v); }));
    GS_RETURN_IF_ERROR(number("momentum", [&](double v) { o.momentum(v); }));
    GS_RETURN_IF_ERROR(number("dampening", [&](double v) { o.dampening(v); }));
    GS_RETURN_IF_ERROR(number("weight_decay", [&](double v) { o.weight_decay(v); }));
    return number("nesterov", [&](double v) { o.nesterov(v != 0); });
  }
  auto fill = [&](auto& o) -> absl::Status {
    GS_RETURN_IF_ERROR(number("lr", [&](double v) { o.lr(v); }));
    GS_RETURN_IF_ERROR(number("eps", [&](double v) { o.eps(v); }));
    GS_RETURN_IF_ERROR(number("weight_decay", [&](double v) { o.weight_decay(v); }));
    GS_RETURN_IF_ERROR(number("amsgrad", [&](double v) { o.amsgrad(v != 0); }));
    const c10::IValue* betas = Find(dict, std::string("betas"));
    if (betas != nullptr && betas->isTuple() &&
        betas->toTupleRef().elements().size() == 2) {
      const auto& b = betas->toTupleRef().elements();
      o.betas(std::make_tuple(b[0].toDouble(), b[1].toDouble()));
    }
    return absl::OkStatus();
  };
  if (kind == Kind::kAdam) return fill(static_cast<torch::optim::AdamOptions&>(options));
  return fill(static_cast<torch::optim::AdamWOptions&>(options));
}

absl::Status Mismatch(const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat("the optimizer state does not fit this optimizer: ", what));
}

}  // namespace

absl::StatusOr<c10::IValue> OptimizerStateDict(
    const torch::optim::Optimizer& optimizer) {
  GS_ASSIGN_OR_RETURN(Kind kind, KindOf(optimizer));
  GenericDict state = NewDict(c10::IntType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    c10::List<int64_t> numbers;
    for (const torch::Tensor& param : group.params()) {
      if (const auto* s = FindOptimizerState(optimizer, param)) {
        state.insert(index, ParamStateDict(kind, *s));
      }
      numbers.push_back(index++);
    }
    GenericDict g = GroupDict(kind, group.options());
    g.insert("params", numbers);
    groups.push_back(g);
  }
  GenericDict out = NewDict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return c10::IValue(out);
}

absl::Status LoadOptimizerStateDict(torch::optim::Optimizer& optimizer,
                                    const c10::IValue& value) {
  GS_ASSIGN_OR_RETURN(Kind kind, KindOf(optimizer));
  if (!value.isGenericDict()) return Mismatch("it is not a dict");
  const GenericDict dict = value.toGenericDict();
  const c10::IValue* state = Find(dict, std::string("state"));
  const c10::IValue* groups = Find(dict, std::string("param_groups"));
  if (state == nullptr || !state->isGenericDict() || groups == nullptr ||
      !groups->isList()) {
    return Mismatch("it has no 'state' dict and 'param_groups' list");
  }
  auto& ours = optimizer.param_groups();
  const auto& theirs = groups->toListRef();
  if (theirs.size() != ours.size()) {
    return Mismatch(absl::StrCat(theirs.size(), " param groups, the optimizer has ",
                                 ours.size()));
  }
  // Parse and check everything first; change nothing on an error.
  std::vector<std::pair<torch::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> parsed;
  int64_t index = 0;
  for (size_t g = 0; g < ours.size(); ++g) {
    if (!theirs[g].isGenericDict()) return Mismatch("a param group is not a dict");
    const GenericDict group = theirs[g].toGenericDict();
    const c10::IValue* params = Find(group, std::string("params"));
    const size_t count = ours[g].params().size();
    if (params == nullptr || !params->isList() || params->toListRef().size() != count) {
      return Mismatch(absl::StrCat("param group ", g, " does not hold ", count,
                                   " parameters"));
    }
    for (size_t i = 0; i < count; ++i) {
      const c10::IValue& number = params->toListRef()[i];
      const torch::Tensor& param = ours[g].params()[i];
      const c10::IValue* entry =
          number.isInt() ? Find(state->toGenericDict(), number) : nullptr;
      ++index;
      if (entry == nullptr) continue;  // no state yet
      if (!entry->isGenericDict()) return Mismatch("a parameter's state is not a dict");
      absl::StatusOr<std::unique_ptr<torch::optim::OptimizerParamState>> s =
          ParseParamState(kind, entry->toGenericDict(), param);
      if (!s.ok()) {
        return Mismatch(absl::StrCat("parameter ", index - 1, ": ", s.status().message()));
      }
      parsed.emplace_back(param, std::move(*s));
    }
  }
  for (size_t g = 0; g < ours.size(); ++g) {
    GS_RETURN_IF_ERROR(ApplyGroup(kind, theirs[g].toGenericDict(), ours[g].options()));
  }
  ReplaceOptimizerState(optimizer, std::move(parsed));
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> CaptureCheckpoint(
    const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
    int64_t step, std::map<std::string, int64_t> counters) {
  Checkpoint checkpoint;
  checkpoint.step = step;
  checkpoint.counters = std::move(counters);
  for (const auto& item : GetStateDict(module)) {
    checkpoint.model.insert(item.key(), Cpu(item.value()));
  }
  GS_ASSIGN_OR_RETURN(checkpoint.optimizer, OptimizerStateDict(optimizer));
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  checkpoint.rng_state = generator.get_state();
  return checkpoint;
}

absl::Status RestoreCheckpoint(const Checkpoint& checkpoint,
                               torch::nn::Module& module,
                               torch::optim::Optimizer& optimizer) {
  // LoadStateDict and LoadOptimizerStateDict each check before they change
  // anything; a model that loads but an optimizer that does not would leave
  // the model changed, so keep a copy to put back.
  StateDict before;
  for (const auto& item : GetStateDict(module)) before.insert(item.key(), item.value().clone());
  GS_RETURN_IF_ERROR(LoadStateDict(module, checkpoint.model));
  absl::Status optimizer_loaded = LoadOptimizerStateDict(optimizer, checkpoint.optimizer);
  if (!optimizer_loaded.ok()) {
    LoadStateDict(module, before).IgnoreError();
    return optimizer_loaded;
  }
  if (checkpoint.rng_state.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(checkpoint.rng_state);
  }
  return absl::OkStatus();
}

absl::Status WriteCheckpoint(const Checkpoint& checkpoint,
                             const std::string& path) {
  GenericDict out = NewDict();
  out.insert("format", std::string(kCheckpointFormat));
  c10::Dict<std::string, torch::Tensor> model;
  for (const auto& item : checkpoint.model) model.insert(item.key(), item.value());
  out.insert("model", model);
  out.insert("optimizer", checkpoint.optimizer);
  out.insert("step", checkpoint.step);
  c10::Dict<std::string, int64_t> counters;
  for (const auto& [name, value] : checkpoint.counters) counters.insert(name, value);
  out.insert("counters", counters);
  if (checkpoint.rng_state.defined()) out.insert("rng_state", checkpoint.rng_state);
  return WriteTorchFile(c10::IValue(out), path);
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  GS_ASSIGN_OR_RETURN(c10::IValue value, ReadTorchFile(path));
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, " is not a gradsync checkpoint: ", what));
  };
  if (!value.isGenericDict()) return corrupt("not a dict");
  const GenericDict dict = value.toGenericDict();
  const c10::IValue* format = Find(dict, std::string("format"));
  if (format == nullptr || !format->isString() ||
      format->toStringRef() != kCheckpointFormat) {
    return corrupt(absl::StrCat("no format '", kCheckpointFormat, "'"));
  }
  Checkpoint checkpoint;
  const c10::IValue* step = Find(dict, std::string("step"));
  const c10::IValue* model = Find(dict, std::string("model"));
  const c10::IValue* optimizer = Find(dict, std::string("optimizer"));
  const c10::IValue* counters = Find(dict, std::string("counters"));
  if (step == nullptr || !step->isInt() || model == nullptr ||
      !model->isGenericDict() || optimizer == nullptr) {
    return corrupt("no step, model or optimizer");
  }
  checkpoint.step = step->toInt();
  for (const auto& entry : model->toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return corrupt("a model entry is not name -> tensor");
    }
    checkpoint.model.insert(entry.key().toStringRef(), entry.value().toTensor());
  }
  checkpoint.optimizer = *optimizer;
  if (counters != nullptr && counters->isGenericDict()) {
    for (const auto& entry : counters->toGenericDict()) {
      if (entry.key().isString() && entry.value().isInt()) {
        checkpoint.counters[entry.key().toStringRef()] = entry.value().toInt();
      }
    }
  }
  const c10::IValue* rng = Find(dict, std::string("rng_state"));
  if (rng != nullptr && rng->isTensor()) checkpoint.rng_state = rng->toTensor();
  return checkpoint;
}

absl::StatusOr<CheckpointDir> CheckpointDir::Open(std::string dir, int keep) {
  if (dir.empty()) return absl::InvalidArgumentError("no checkpoint folder given");
  if (keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep at least 1 checkpoint, got ", keep));
  }
  // mkdir -p.
  for (size_t at = 1; at <= dir.size(); ++at) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string prefix = dir.substr(0, at);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("cannot make the checkpoint folder ",
                                              prefix, ": ", std::strerror(errno)));
    }
  }
  return CheckpointDir(std::move(dir), keep);
}

std::vector<std::string> CheckpointDir::List() const {
  std::vector<std::pair<int64_t, std::string>> found;
  if (DIR* listing = ::opendir(dir_.c_str())) {
    while (dirent* entry = ::readdir(listing)) {
      absl::string_view name = entry->d_name;
      int64_t step = 0;
      if (absl::ConsumePrefix(&name, "checkpoint-") &&
          absl::ConsumeSuffix(&name, ".pt") && absl::SimpleAtoi(name, &step)) {
        found.emplace_back(step, absl::StrCat(dir_, "/", entry->d_name));
      }
    }
    ::closedir(listing);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

absl::Status CheckpointDir::Save(const Checkpoint& checkpoint) {
  const std::string path = absl::StrCat(dir_, "/checkpoint-", checkpoint.step, ".pt");
  GS_RETURN_IF_ERROR(WriteCheckpoint(checkpoint, path));
  std::vector<std::string> all = List();
  for (size_t i = 0; i + keep_ < all.size(); ++i) {
    if (::unlink(all[i].c_str()) != 0) {
      GS_LOG(WARNING) << "cannot remove the old checkpoint " << all[i] << ": "
                      << std::strerror(errno);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Checkpoint>> CheckpointDir::LoadLatest() const {
  std::vector<std::string> all = List();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    absl::StatusOr<Checkpoint> checkpoint = ReadCheckpoint(*it);
    if (checkpoint.ok()) return std::optional<Checkpoint>(std::move(*checkpoint));
    GS_LOG(WARNING) << "skipping the checkpoint " << *it << ": "
                    << checkpoint.status();
  }
  return std::optional<Checkpoint>();
}

}  // namespace gradsync
