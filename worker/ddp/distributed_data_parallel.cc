#include "worker/ddp/distributed_data_parallel.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/ddp/tensor_buffer.h"

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
  GS_RETURN_IF_ERROR(backend->AllGather(in, out)->Wait(timeout));
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

}  // namespace

absl::Status BroadcastTensors(Backend* backend,
                              const std::vector<torch::Tensor>& tensors,
                              absl::Duration timeout, int root) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& tensor : tensors) {
    torch::Tensor contiguous = tensor.contiguous();
    GS_ASSIGN_OR_RETURN(Buffer buffer, ToBuffer(contiguous));
    GS_RETURN_IF_ERROR(backend->Broadcast(buffer, root)->Wait(timeout));
    if (!contiguous.is_same(tensor)) tensor.copy_(contiguous);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>>
DistributedDataParallel::Create(std::shared_ptr<torch::nn::Module> module,
                                Backend* backend, DdpOptions options,
                                Clock* clock) {
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
  const torch::Device device = params.front().device();
  const absl::Duration timeout = options.reducer.timeout;
  GS_RETURN_IF_ERROR(
      VerifyModelsMatch(backend, names, params, device, timeout));
  if (options.broadcast_initial_state) {
    GS_RETURN_IF_ERROR(BroadcastTensors(backend, params, timeout));
  }
  std::unique_ptr<DistributedDataParallel> ddp(
      new DistributedDataParallel(std::move(module), backend, options, clock));
  if (options.broadcast_initial_state) {
    GS_RETURN_IF_ERROR(BroadcastTensors(backend, ddp->buffers_, timeout));
  }
  ddp->reducer_ = std::make_unique<Reducer>(std::move(names), std::move(params),
                                            backend, options.reducer, clock);
  return ddp;
}

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<torch::nn::Module> module, Backend* backend,
    DdpOptions options, Clock* clock)
    : module_(std::move(module)),
      backend_(backend),
      options_(options),
      clock_(clock) {
  for (const torch::Tensor& buffer : module_->buffers(/*recurse=*/true)) {
    buffers_.push_back(buffer);
  }
}

absl::Status DistributedDataParallel::communication_error() const {
  if (!broadcast_error_.ok()) return broadcast_error_;
  return reducer_->communication_error();
}

absl::Time DistributedDataParallel::BeginForward() {
  const absl::Time start = clock_->Now();
  broadcast_error_ = absl::OkStatus();
  if (options_.broadcast_buffers && sync_ && !buffers_.empty()) {
    absl::Status status =
        BroadcastTensors(backend_, buffers_, options_.reducer.timeout);
    broadcast_error_ = status;
    TORCH_CHECK(status.ok(), "DistributedDataParallel: broadcasting buffers "
                             "failed: ", status.ToString());
  }
  return start;
}

void DistributedDataParallel::EndForward(absl::Time start) {
  reducer_->PrepareForBackward(sync_, clock_->Now() - start);
}

}  // namespace gradsync
