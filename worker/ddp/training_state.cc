#include "worker/ddp/training_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "common/status_macros.h"
#include "worker/ddp/tensor_broadcast.h"
#include "worker/ddp/tensor_buffer.h"

namespace gradsync {
namespace {

// Root's bytes to every rank: the length, then the bytes (on `device`, where
// the backend wants its buffers).
absl::Status BroadcastBytes(Backend* backend, int root, std::string* bytes,
                            const torch::Device& device,
                            absl::Duration timeout) {
  torch::Tensor length =
      torch::tensor({static_cast<int64_t>(bytes->size())}, torch::kInt64)
          .to(device);
  GS_RETURN_IF_ERROR(BroadcastTensors(backend, {length}, timeout, root));
  const int64_t n = length.cpu().item<int64_t>();
  torch::Tensor data = torch::zeros({n}, torch::kUInt8);
  if (backend->rank() == root) {
    std::memcpy(data.data_ptr<uint8_t>(), bytes->data(), n);
  }
  data = data.to(device);
  GS_RETURN_IF_ERROR(BroadcastTensors(backend, {data}, timeout, root));
  if (backend->rank() != root) {
    torch::Tensor host = data.cpu();
    bytes->assign(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), n);
  }
  return absl::OkStatus();
}

// Root's optimizer state as bytes (torch::save: any LibTorch optimizer).
absl::StatusOr<std::string> SerializeOptimizer(
    torch::optim::Optimizer& optimizer) {
  try {
    std::ostringstream out;
    torch::save(optimizer, out);
    return out.str();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(
        "cannot serialize the optimizer state: ", e.what_without_backtrace()));
  }
}

// Replaces `optimizer`'s state with root's `bytes`, onto `device`.
absl::Status LoadOptimizer(const std::string& bytes, int root,
                           torch::optim::Optimizer& optimizer,
                           const torch::Device& device) {
  try {
    optimizer.state().clear();
    std::istringstream in(bytes);
    torch::load(optimizer, in, device);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("cannot load rank ", root,
                     "'s optimizer state: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

// Root's state of `generator` (a CPU byte tensor), through a tensor on
// `device`; on root its own.
absl::StatusOr<torch::Tensor> BroadcastGeneratorState(
    Backend* backend, int root, at::Generator generator,
    const torch::Device& device, absl::Duration timeout) {
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  torch::Tensor on_device = state.to(device);
  GS_RETURN_IF_ERROR(BroadcastTensors(backend, {on_device}, timeout, root));
  return on_device.cpu();
}

// The default generators a training step draws from: the CPU's, and on a
// GPU that device's (a simulated GPU's tensors are on the CPU).
std::vector<at::Generator> DefaultGenerators(const torch::Device& device) {
  std::vector<at::Generator> generators = {
      at::detail::getDefaultCPUGenerator()};
  if (device.is_cuda()) {
    generators.push_back(at::globalContext().defaultGenerator(device));
  }
  return generators;
}

// Where a receiving rank takes root's tensors in: new tensors like them.
std::vector<torch::Tensor> EmptyLike(
    const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> empty;
  empty.reserve(tensors.size());
  for (const torch::Tensor& t : tensors) {
    empty.push_back(torch::empty_like(t, at::MemoryFormat::Contiguous));
  }
  return empty;
}

}  // namespace

absl::Status BroadcastTrainingState(Backend* backend, int root,
                                    torch::nn::Module& module,
                                    torch::optim::Optimizer& optimizer,
                                    std::vector<int64_t>* counters,
                                    absl::Duration timeout) {
  GS_RETURN_IF_ERROR(CheckRoot(root, backend->world_size()));
  const bool receiving = backend->rank() != root;
  std::vector<torch::Tensor> tensors = module.parameters(/*recurse=*/true);
  for (const torch::Tensor& buffer : module.buffers(/*recurse=*/true)) {
    tensors.push_back(buffer);
  }
  const torch::Device device =
      tensors.empty() ? torch::Device(torch::kCPU) : tensors.front().device();
  torch::Tensor root_counters;
  if (!counters->empty()) {
    root_counters = torch::tensor(*counters, torch::kInt64).to(device);
    GS_RETURN_IF_ERROR(
        BroadcastTensors(backend, {root_counters}, timeout, root));
  }
  Failpoint(kFailpointStateTransfer);
  const std::vector<torch::Tensor> root_tensors =
      receiving ? EmptyLike(tensors) : tensors;
  GS_RETURN_IF_ERROR(BroadcastTensors(backend, root_tensors, timeout, root));
  std::string optimizer_bytes;
  if (!receiving) {
    GS_ASSIGN_OR_RETURN(optimizer_bytes, SerializeOptimizer(optimizer));
  }
  GS_RETURN_IF_ERROR(
      BroadcastBytes(backend, root, &optimizer_bytes, device, timeout));
  const std::vector<at::Generator> generators = DefaultGenerators(device);
  std::vector<torch::Tensor> generator_states;
  for (const at::Generator& generator : generators) {
    GS_ASSIGN_OR_RETURN(
        torch::Tensor state,
        BroadcastGeneratorState(backend, root, generator, device, timeout));
    generator_states.push_back(std::move(state));
  }
  if (!receiving) return absl::OkStatus();
  // All of root's state arrived: only now does it replace this rank's, so
  // that a transfer cut short leaves this rank its own whole state.
  GS_RETURN_IF_ERROR(LoadOptimizer(optimizer_bytes, root, optimizer, device));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < tensors.size(); ++i) {
      tensors[i].copy_(root_tensors[i]);
    }
  }
  for (size_t i = 0; i < generators.size(); ++i) {
    at::Generator generator = generators[i];
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(generator_states[i]);
  }
  if (!counters->empty()) {
    torch::Tensor host = root_counters.cpu();
    const int64_t* p = host.data_ptr<int64_t>();
    counters->assign(p, p + counters->size());
  }
  return absl::OkStatus();
}

}  // namespace gradsync
