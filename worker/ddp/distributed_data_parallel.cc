#include "worker/ddp/distributed_data_parallel.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/ddp/state_dict.h"
#include "worker/ddp/tensor_broadcast.h"
#include "worker/ddp/tensor_buffer.h"
#include "worker/ddp/uneven_inputs.h"

namespace gradsync {
namespace {

// Each parameter's signature: [dtype, ndim, dims (padded to kMaxDims),
// name hash]; all-gathered to find the first mismatch.
constexpr int kMaxDims = 8;
constexpr int kSignatureWidth = kMaxDims + 3;

std::vector<int64_t> Signature(const std::string& name,
                               const torch::Tensor& param) {
  std::vector<int64_t> s(kSignatureWidth, -1);
  s[0] = static_cast<int64_t>(param.scalar_type());
  s[1] = param.dim();
  for (int d = 0; d < std::min<int64_t>(param.dim(), kMaxDims); ++d) {
    s[2 + d] = param.size(d);
  }
  s[kSignatureWidth - 1] =
      static_cast<int64_t>(std::hash<std::string>()(name) & 0x7fffffffffff);
  return s;
}

std::string Describe(const std::vector<int64_t>& s) {
  std::vector<int64_t> dims;
  for (int d = 0; d < std::min<int64_t>(s[1], kMaxDims); ++d) {
    dims.push_back(s[2 + d]);
  }
  return absl::StrCat(c10::toString(static_cast<c10::ScalarType>(s[0])), " [",
                      absl::StrJoin(dims, ", "), "]");
}

absl::StatusOr<torch::Tensor> AllGather(Backend* backend,
                                        const torch::Tensor& input,
                                        absl::Duration timeout) {
  torch::Tensor output = torch::empty({backend->world_size() * input.numel()},
                                      input.options());
  GS_ASSIGN_OR_RETURN(Buffer in, ToBuffer(input));
  GS_ASSIGN_OR_RETURN(Buffer out, ToBuffer(output));
  GS_RETURN_IF_ERROR(backend->Await(*backend->AllGather(in, out), timeout));
  return output.cpu().view({backend->world_size(), input.numel()});
}

// FAILED_PRECONDITION naming the first parameter that differs from rank 0's.
absl::Status VerifyModelsMatch(Backend* backend,
                               const std::vector<std::string>& names,
                               const std::vector<torch::Tensor>& params,
                               const torch::Device& device,
                               absl::Duration timeout) {
  torch::Tensor count =
      torch::tensor({static_cast<int64_t>(params.size())}, torch::kInt64)
          .to(device);
  GS_ASSIGN_OR_RETURN(torch::Tensor counts, AllGather(backend, count, timeout));
  for (int r = 1; r < backend->world_size(); ++r) {
    if (counts[r][0].item<int64_t>() != counts[0][0].item<int64_t>()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the models differ across ranks: rank 0 has ",
          counts[0][0].item<int64_t>(), " parameters, rank ", r, " has ",
          counts[r][0].item<int64_t>()));
    }
  }
  std::vector<int64_t> mine;
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<int64_t> s = Signature(names[i], params[i]);
    mine.insert(mine.end(), s.begin(), s.end());
  }
  if (mine.empty()) return absl::OkStatus();
  torch::Tensor local = torch::tensor(mine, torch::kInt64).to(device);
  GS_ASSIGN_OR_RETURN(torch::Tensor all, AllGather(backend, local, timeout));
  auto at = [&](int rank, size_t param) {
    std::vector<int64_t> s(kSignatureWidth);
    for (int k = 0; k < kSignatureWidth; ++k) {
      s[k] = all[rank][param * kSignatureWidth + k].item<int64_t>();
    }
    return s;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<int64_t> rank0 = at(0, i);
    for (int r = 1; r < backend->world_size(); ++r) {
      std::vector<int64_t> other = at(r, i);
      if (other == rank0) continue;
      const bool name_differs =
          other[kSignatureWidth - 1] != rank0[kSignatureWidth - 1];
      return absl::FailedPreconditionError(absl::StrCat(
          "the models differ across ranks: parameter #", i, " (", names[i],
          " here, rank ", backend->rank(), ") is ", Describe(rank0),
          " on rank 0 and ", Describe(other), " on rank ", r,
          name_differs ? ", and its name differs" : ""));
    }
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT unless the device options fit one device per process.
absl::Status CheckDevices(const DdpOptions& options,
                          const std::vector<std::string>& names,
                          const std::vector<torch::Tensor>& params) {
  if (options.device_ids.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_ids names ", options.device_ids.size(),
        " devices: gradsync's DDP runs one device per process (as PyTorch "
        "recommends); start one process per device"));
  }
  if (options.device_ids.empty()) return absl::OkStatus();
  const torch::Device& device = options.device_ids.front();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_ids is [", device.str(), "] but parameter ", names[i],
          " is on ", params[i].device().str(),
          ": move the module to its device before wrapping it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedDataParallel>>
DistributedDataParallel::CreateImpl(
    std::shared_ptr<torch::nn::Module> module,
    std::function<torch::Tensor(const torch::Tensor&)> forward,
    Backend* backend, DdpOptions options, Clock* clock) {
  if (module == nullptr || backend == nullptr) {
    return absl::InvalidArgumentError("DDP needs a module and a backend");
  }
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  if (params.empty()) {
    return absl::InvalidArgumentError(
        "the module has no parameters that require gradients");
  }
  GS_RETURN_IF_ERROR(CheckDevices(options, names, params));
  const torch::Device device = params.front().device();
  const absl::Duration timeout = options.reducer.timeout;
  GS_RETURN_IF_ERROR(
      VerifyModelsMatch(backend, names, params, device, timeout));
  if (options.broadcast_initial_state) {
    GS_RETURN_IF_ERROR(BroadcastTensors(backend, params, timeout));
  }
  std::unique_ptr<DistributedDataParallel> ddp(new DistributedDataParallel(
      std::move(module), std::move(forward), backend, options, clock));
  ddp->device_ = device;
  if (options.broadcast_initial_state) {
    GS_RETURN_IF_ERROR(BroadcastTensors(backend, ddp->buffers_, timeout));
  }
  ddp->reducer_ = std::make_unique<Reducer>(std::move(names), std::move(params),
                                            backend, options.reducer, clock);
  for (const auto& sync : ddp->sync_batch_norms_) sync->Attach(backend, timeout);
  return ddp;
}

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<torch::nn::Module> module,
    std::function<torch::Tensor(const torch::Tensor&)> forward,
    Backend* backend, DdpOptions options, Clock* clock)
    : module_(std::move(module)),
      module_forward_(std::move(forward)),
      backend_(backend),
      options_(std::move(options)),
      clock_(clock) {
  for (const torch::Tensor& buffer : module_->buffers(/*recurse=*/true)) {
    if (buffer.defined()) buffers_.push_back(buffer);
  }
  sync_batch_norms_ = FindSyncBatchNorms(*module_);
}

DistributedDataParallel::~DistributedDataParallel() {
  // The backend may go before the module (a recovered round builds a new
  // one): the SyncBatchNorm layers must not keep it.
  for (const auto& sync : sync_batch_norms_) sync->Attach(nullptr, absl::ZeroDuration());
}

absl::Status DistributedDataParallel::communication_error() const {
  if (!broadcast_error_.ok()) return broadcast_error_;
  for (const auto& sync : sync_batch_norms_) {
    absl::Status status = sync->communication_error();
    if (!status.ok()) return status;
  }
  return reducer_->communication_error();
}

torch::Tensor DistributedDataParallel::forward(const torch::Tensor& input) {
  TORCH_CHECK(module_forward_ != nullptr,
              "DistributedDataParallel::forward: the module was wrapped as a "
              "type without forward(Tensor) -> Tensor; create the DDP model "
              "from the module's own type, or run it with ddp->Forward([&] { "
              "return model->forward(...); })");
  torch::Tensor x = input;
  if (!options_.device_ids.empty()) {
    x = x.to(options_.device_ids.front(), /*non_blocking=*/true);
  }
  torch::Tensor output = Forward([&] { return module_forward_(x); });
  if (options_.output_device.has_value()) {
    output = output.to(*options_.output_device, /*non_blocking=*/true);
  }
  return output;
}

StateDict DistributedDataParallel::state_dict() const {
  return GetStateDict(*module_, kDdpPrefix);
}

absl::Status DistributedDataParallel::load_state_dict(const StateDict& state) {
  return LoadStateDict(*module_, state);
}

absl::Status DistributedDataParallel::CheckStep() {
  const absl::Status buffers = CheckBufferBroadcasts();
  // Always: it also clears the step's record of collectives.
  const absl::Status gradients = reducer_->CheckStepCollectives();
  return buffers.ok() ? gradients : buffers;
}

void DistributedDataParallel::BroadcastBuffers(int root) {
  absl::StatusOr<std::vector<std::shared_ptr<Work>>> works =
      BroadcastTensorsOrdered(backend_, buffers_, options_.reducer.timeout,
                              root);
  if (!works.ok()) {
    broadcast_error_ = works.status();
    TORCH_CHECK(false, "DistributedDataParallel: broadcasting buffers "
                       "failed: ", works.status().ToString());
  }
  buffer_works_ = std::move(*works);
}

absl::Status DistributedDataParallel::CheckBufferBroadcasts() {
  std::vector<std::shared_ptr<Work>> works = std::move(buffer_works_);
  buffer_works_.clear();
  for (const std::shared_ptr<Work>& work : works) {
    const absl::Status status = work->Wait(options_.reducer.timeout);
    if (status.ok()) continue;
    broadcast_error_ = absl::Status(
        status.code(),
        absl::StrCat("the buffer broadcast before the forward (#",
                     work->sequence(), ") failed: ", status.message()));
    return broadcast_error_;
  }
  return absl::OkStatus();
}

absl::Time DistributedDataParallel::BeginForward() {
  const absl::Time start = clock_->Now();
  broadcast_error_ = absl::OkStatus();
  // The last forward's broadcasts, when no CheckStep came after it (an
  // evaluation pass): these buffers build on what they brought.
  const absl::Status unchecked = CheckBufferBroadcasts();
  TORCH_CHECK(unchecked.ok(), "DistributedDataParallel: ",
              unchecked.ToString());
  divisor_ = backend_->world_size();
  int root = 0;
  bool sync = sync_;
  if (uneven_ != nullptr) {
    // Tell the ranks that ran out of data what this step does.
    UnevenInputs::Vote vote;
    vote.active = 1;
    vote.sync = sync_ ? 1 : 0;
    absl::StatusOr<UnevenInputs::Tally> tally = uneven_->Exchange(vote);
    if (!tally.ok()) {
      broadcast_error_ = tally.status();
      TORCH_CHECK(false, "DistributedDataParallel: uneven inputs: ",
                  tally.status().ToString());
    }
    root = tally->authority;
    sync = tally->sync;
    divisor_ = uneven_->Divisor(*tally);
  }
  if (options_.broadcast_buffers && sync && !buffers_.empty()) {
    BroadcastBuffers(root);
  }
  return start;
}

void DistributedDataParallel::EndForward(absl::Time start) {
  reducer_->PrepareForBackward(sync_, clock_->Now() - start, divisor_);
}

}  // namespace gradsync
