// SyncBatchNorm for LibTorch modules: batch normalization whose training
// statistics are those of the global batch across the ranks of a DDP model,
// as PyTorch's torch.nn.SyncBatchNorm, on CPU (Gloo, shared memory) as well
// as CUDA (NCCL).
//
//   auto model = MakeResNet(...);                   // BatchNorm2d inside
//   GS_RETURN_IF_ERROR(ConvertSyncBatchNorm(model.ptr()).status());
//   auto ddp = DistributedDataParallel::Create(model, backend, options);
//
// DistributedDataParallel::Create attaches its backend to every
// SyncBatchNorm of its module (and detaches it when destroyed); a
// SyncBatchNorm with no backend attached, or in eval mode, is a plain
// BatchNorm and communicates nothing.
#ifndef GRADSYNC_WORKER_DDP_SYNC_BATCH_NORM_H_
#define GRADSYNC_WORKER_DDP_SYNC_BATCH_NORM_H_

#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/types.h>

#include <memory>
#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"

namespace gradsync {

// Training forward: each rank computes its batch's per-channel count, mean
// and sum of squared deviations, one all-gather combines them into the global mean and biased variance
// (Chan's parallel formula, exact for any mix of batch sizes, including
// empty ones), and the running statistics are updated with the unbiased
// global variance, as PyTorch does. Backward: the per-channel sums of the
// output gradient and of its product with the centred input are all-reduced
// (one collective) to form the input gradient; the weight and bias
// gradients stay local, for DDP to average. Input [N, C, ...] (at least 2
// dimensions). Statistics and sums accumulate in double on the CPU and in
// float on CUDA, as ATen's BatchNorm does (in float32 on the CPU the
// training drifts from plain BatchNorm's measurably within a dozen steps).
// Parameters and buffers are BatchNorm's (weight, bias,
// running_mean, running_var, num_batches_tracked), so state dicts move
// between the two.
//
// Thread-safety: forward and backward run on the training thread and the
// autograd engine; attaching and detaching are guarded, but must not happen
// during a step. Lifetime: an attached backend must outlive the steps that
// use it (DDP detaches before its backend goes).
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options);
  // Registers these tensors (a BatchNorm's, as ConvertSyncBatchNorm passes
  // them) instead of new ones, so whoever holds them (an optimizer) still
  // trains this module.
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                    torch::Tensor weight, torch::Tensor bias,
                    torch::Tensor running_mean, torch::Tensor running_var,
                    torch::Tensor num_batches_tracked);

  torch::Tensor forward(const torch::Tensor& input);

  // Cloneable's: (re)creates the parameters and buffers from `options`.
  void reset() override;
  // Running statistics to their initial values; weight 1, bias 0.
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  // Reduces statistics over `backend` from now on (nullptr: none), each
  // collective waiting at most `timeout`.
  void Attach(Backend* backend, absl::Duration timeout);
  // The error of the last collective that failed a step, so the training
  // loop can tell a lost peer (UNAVAILABLE, ...) from a bug; OK if none.
  // Cleared by a forward that succeeds.
  absl::Status communication_error() const;

  torch::nn::BatchNormOptions options;
  torch::Tensor weight;
  torch::Tensor bias;
  torch::Tensor running_mean;
  torch::Tensor running_var;
  torch::Tensor num_batches_tracked;

 private:
  void Register(torch::Tensor weight, torch::Tensor bias,
                torch::Tensor running_mean, torch::Tensor running_var,
                torch::Tensor num_batches_tracked, bool shared);

  // The backend this module reduces over. Shared with the autograd nodes
  // of steps in flight, which report failures of the backward collective
  // here; reset() (and so clone()) makes a new, detached one.
  struct Link {
    absl::Mutex mu;
    Backend* backend ABSL_GUARDED_BY(mu) = nullptr;
    absl::Duration timeout ABSL_GUARDED_BY(mu) = absl::Minutes(30);
    absl::Status error ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Link> link_ = std::make_shared<Link>();
};
TORCH_MODULE(SyncBatchNorm);

// Replaces every BatchNorm1d, BatchNorm2d and BatchNorm3d in `module`'s tree
// with a SyncBatchNorm holding the same options, parameters (the same
// tensors) and running statistics, in training mode as it was, and returns
// the module to use: `module` itself, converted in place, or a new
// SyncBatchNorm when `module` is a BatchNorm. PyTorch's
// SyncBatchNorm.convert_sync_batchnorm.
//
// A BatchNorm is replaced where its parent is a torch::nn::Sequential (in
// place, so the Sequential's forward uses it) or where nothing but its
// parent's module registry refers to it (a parent that calls it through
// ForwardBatchNorm(name) below). A BatchNorm that anything else holds,
// typically a `torch::nn::BatchNorm2d` field that its parent's forward
// calls, cannot be swapped from outside in C++: then nothing is changed and
// the result is FAILED_PRECONDITION naming it and the fix.
absl::StatusOr<std::shared_ptr<torch::nn::Module>> ConvertSyncBatchNorm(
    std::shared_ptr<torch::nn::Module> module);

// Runs `module`'s child `name`, a BatchNorm1d/2d/3d or SyncBatchNorm, on
// `input`: for custom modules whose norm layers ConvertSyncBatchNorm should
// be able to swap (they register the layer and keep no typed field of it).
// Fails (c10::Error) when there is no such child.
torch::Tensor ForwardBatchNorm(torch::nn::Module& module,
                               const std::string& name,
                               const torch::Tensor& input);

// Every SyncBatchNorm in `module`'s tree.
std::vector<std::shared_ptr<SyncBatchNormImpl>> FindSyncBatchNorms(
    torch::nn::Module& module);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_SYNC_BATCH_NORM_H_
