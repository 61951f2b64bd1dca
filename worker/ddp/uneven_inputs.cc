#include "worker/ddp/uneven_inputs.h"

#include <torch/torch.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/ddp/tensor_broadcast.h"
#include "worker/ddp/tensor_buffer.h"

namespace gradsync {

absl::StatusOr<std::unique_ptr<UnevenInputs>> UnevenInputs::Create(
    DistributedDataParallel* ddp, UnevenInputsOptions options) {
  if (ddp == nullptr) {
    return absl::InvalidArgumentError("UnevenInputs needs a DDP model");
  }
  if (!ddp->sync_batch_norms_.empty()) {
    return absl::FailedPreconditionError(
        "uneven inputs cannot be used with SyncBatchNorm: a rank out of data "
        "cannot take part in the batch statistics of the others' forward "
        "passes (PyTorch's Join has the same limit); give every rank the same "
        "number of batches, e.g. with DistributedSampler(drop_last)");
  }
  if (ddp->uneven_ != nullptr) {
    return absl::FailedPreconditionError(
        "an UnevenInputs scope is already active on this DDP model");
  }
  std::unique_ptr<UnevenInputs> scope(new UnevenInputs(ddp, options));
  ddp->uneven_ = scope.get();
  return scope;
}

UnevenInputs::~UnevenInputs() { ddp_->uneven_ = nullptr; }

int64_t UnevenInputs::Divisor(const Tally& tally) const {
  if (options_.divide_by_initial_world_size || tally.active == 0) {
    return ddp_->world_size();
  }
  return tally.active;
}

absl::StatusOr<UnevenInputs::Tally> UnevenInputs::Exchange(const Vote& vote) {
  Backend* backend = ddp_->backend_;
  const int world = backend->world_size();
  torch::Tensor mine =
      torch::tensor({vote.active, vote.sync, vote.just_finished}, torch::kInt64);
  torch::Tensor all = torch::empty({world * 3}, torch::kInt64);
  if (!ddp_->device_.is_cpu()) {  // NCCL takes device memory only
    mine = mine.to(ddp_->device_);
    all = all.to(ddp_->device_);
  }
  GS_ASSIGN_OR_RETURN(Buffer in, ToBuffer(mine));
  GS_ASSIGN_OR_RETURN(Buffer out, ToBuffer(all));
  GS_RETURN_IF_ERROR(backend->Await(*backend->AllGather(in, out),
                                    ddp_->options_.reducer.timeout));
  torch::Tensor votes = all.cpu().view({world, 3});
  auto v = votes.accessor<int64_t, 2>();
  Tally tally;
  for (int r = 0; r < world; ++r) {
    if (v[r][0] != 0) {
      ++tally.active;
      tally.sync = tally.sync || v[r][1] != 0;
      tally.authority = r;
    }
    if (v[r][2] != 0) tally.last_finisher = r;
  }
  return tally;
}

absl::Status UnevenInputs::Finish() {
  if (finished_) {
    return absl::FailedPreconditionError("UnevenInputs::Finish ran already");
  }
  finished_ = true;
  Vote vote;
  vote.just_finished = 1;
  for (;;) {
    absl::StatusOr<Tally> tally = Exchange(vote);
    if (!tally.ok()) {
      ddp_->broadcast_error_ = tally.status();
      return tally.status();
    }
    vote.just_finished = 0;
    if (tally->active == 0) {
      // Everyone is done: all take the model of the last to finish.
      std::vector<torch::Tensor> state = ddp_->module_->parameters();
      state.insert(state.end(), ddp_->buffers_.begin(), ddp_->buffers_.end());
      return BroadcastTensors(ddp_->backend_, state,
                              ddp_->options_.reducer.timeout,
                              tally->last_finisher);
    }
    // Match one step of the ranks still training: the buffer broadcast of
    // their forward, then their backward's buckets.
    if (ddp_->options_.broadcast_buffers && tally->sync &&
        !ddp_->buffers_.empty()) {
      absl::Status status = BroadcastTensors(
          ddp_->backend_, ddp_->buffers_, ddp_->options_.reducer.timeout,
          tally->authority);
      if (!status.ok()) return status;
    }
    if (tally->sync) {
      GS_RETURN_IF_ERROR(ddp_->reducer_->ShadowBackward(Divisor(*tally)));
    }
    ++shadowed_steps_;
  }
}

}  // namespace gradsync
