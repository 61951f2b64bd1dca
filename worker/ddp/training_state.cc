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

absl::Status BroadcastOptimizer(Backend* backend, int root,
                                torch::optim::Optimizer& optimizer,
                                const torch::Device& device,
                                absl::Duration timeout) {
  std::string bytes;
  try {
    if (backend->rank() == root) {
      std::ostringstream out;
      torch::save(optimizer, out);
      bytes = out.str();
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(
        "cannot serialize the optimizer state: ", e.what_without_backtrace()));
  }
  GS_RETURN_IF_ERROR(BroadcastBytes(backend, root, &bytes, device, timeout));
  if (backend->rank() == root) return absl::OkStatus();
  try {
    optimizer.state().clear();
    std::istringstream in(bytes);
    torch::load(optimizer, in, device);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(
        "cannot load rank ", root,
        "'s optimizer state: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

// Copies root's state of `generator` to every rank, through a tensor on
// `device` (the state itself is a CPU byte tensor).
absl::Status BroadcastGenerator(Backend* backend, int root,
                                at::Generator generator,
                                const torch::Device& device,
                                absl::Duration timeout) {
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  torch::Tensor on_device = state.to(device);
  GS_RETURN_IF_ERROR(BroadcastTensors(backend, {on_device}, timeout, root));
  if (backend->rank() != root) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(on_device.cpu());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BroadcastTrainingState(Backend* backend, int root,
                                    torch::nn::Module& module,
                                    torch::optim::Optimizer& optimizer,
                                    std::vector<int64_t>* counters,
                                    absl::Duration timeout) {
  GS_RETURN_IF_ERROR(CheckRoot(root, backend->world_size()));
  std::vector<torch::Tensor> tensors = module.parameters(/*recurse=*/true);
  for (const torch::Tensor& buffer : module.buffers(/*recurse=*/true)) {
    tensors.push_back(buffer);
  }
  const torch::Device device =
      tensors.empty() ? torch::Device(torch::kCPU) : tensors.front().device();
  if (!counters->empty()) {
    torch::Tensor values = torch::tensor(*counters, torch::kInt64).to(device);
    GS_RETURN_IF_ERROR(BroadcastTensors(backend, {values}, timeout, root));
    torch::Tensor host = values.cpu();
    const int64_t* p = host.data_ptr<int64_t>();
    counters->assign(p, p + counters->size());
  }
  Failpoint(kFailpointStateTransfer);
  GS_RETURN_IF_ERROR(BroadcastTensors(backend, tensors, timeout, root));
  GS_RETURN_IF_ERROR(BroadcastOptimizer(backend, root, optimizer, device, timeout));
  GS_RETURN_IF_ERROR(BroadcastGenerator(
      backend, root, at::detail::getDefaultCPUGenerator(), device, timeout));
  if (!device.is_cuda()) return absl::OkStatus();
  // The GPU's own generator (dropout and random ops on it).
  return BroadcastGenerator(backend, root,
                            at::globalContext().defaultGenerator(device),
                            device, timeout);
}

}  // namespace gradsync
