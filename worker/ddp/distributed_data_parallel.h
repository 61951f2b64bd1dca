// DistributedDataParallel for LibTorch modules: what PyTorch's DDP does, on a
// gradsync Backend. Wrap the module, run each forward through the wrapper,
// call backward() as usual: gradients arrive averaged across ranks, and
// buckets are all-reduced while backward is still running.
//
//   auto ddp = DistributedDataParallel::Create(model, backend, options);
//   torch::Tensor loss = loss_fn((*ddp)->forward(x), y);   // PyTorch's ddp(x)
//   loss.backward();
//   GS_RETURN_IF_ERROR((*ddp)->CheckStep());  // before applying the step
//   optimizer.step();
//
// A backward pass that no forward through the wrapper prepared (the module
// called directly) fails naming the fix instead of training each rank on its
// own gradients.
#ifndef GRADSYNC_WORKER_DDP_DISTRIBUTED_DATA_PARALLEL_H_
#define GRADSYNC_WORKER_DDP_DISTRIBUTED_DATA_PARALLEL_H_

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/backend/backend.h"
#include "worker/backend/work.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/reducer.h"
#include "worker/ddp/state_dict.h"
#include "worker/ddp/sync_batch_norm.h"

namespace gradsync {

struct DdpOptions {
  ReducerOptions reducer;
  // Broadcast the buffers (e.g. batch-norm statistics) of rank 0 (under
  // uneven inputs, of the highest rank still training) before every
  // synchronized forward, in one collective per dtype. On a stream-ordered
  // backend (NCCL) the host does not wait for it: the forward's kernels are
  // queued after it, and CheckStep (or, when none came, the next forward)
  // says whether it succeeded.
  bool broadcast_buffers = true;
  // Create copies rank 0's parameters and buffers to every rank (PyTorch's
  // behaviour). Off when the caller copies the state itself, e.g. with
  // BroadcastTrainingState from a recovered round's source rank, which need
  // not be rank 0.
  bool broadcast_initial_state = true;
  // PyTorch's device_ids: empty for a CPU module, or the one device of a
  // module that lives on one GPU (one device per process); forward() moves
  // its input there. The module's parameters must be on it.
  std::vector<torch::Device> device_ids;
  // PyTorch's output_device: where forward() puts its output; unset, the
  // output stays where the module made it (device_ids[0]).
  std::optional<torch::Device> output_device;
};

class UnevenInputs;

// Not thread-safe: one training loop drives it. Lifetime: the module, the
// backend and the clock must outlive it.
class DistributedDataParallel {
 public:
  // Checks the options (INVALID_ARGUMENT: more than one device id, or
  // parameters not on device_ids[0]) and that every rank holds the same
  // parameters (count, names, shapes, dtypes; FAILED_PRECONDITION naming
  // the first mismatch), then copies rank 0's parameters and buffers to
  // every rank (unless options.broadcast_initial_state is off), and
  // attaches `backend` to the module's SyncBatchNorm layers. Collective:
  // every rank calls it. `module` is a Module or a module holder (e.g.
  // torch::nn::Sequential); forward(x) needs a module type with
  // forward(Tensor) -> Tensor, otherwise use Forward(fn).
  template <typename M>
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      std::shared_ptr<M> module, Backend* backend,
      DdpOptions options = DdpOptions(), Clock* clock = RealClock::Get()) {
    std::function<torch::Tensor(const torch::Tensor&)> forward;
    if constexpr (HasTensorForward<M>::value) {
      M* impl = module.get();
      forward = [impl](const torch::Tensor& x) -> torch::Tensor {
        return impl->forward(x);
      };
    }
    return CreateImpl(std::move(module), std::move(forward), backend,
                      std::move(options), clock);
  }
  template <typename M>
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      const torch::nn::ModuleHolder<M>& module, Backend* backend,
      DdpOptions options = DdpOptions(), Clock* clock = RealClock::Get()) {
    return Create(module.ptr(), backend, std::move(options), clock);
  }
  ~DistributedDataParallel();

  // PyTorch's ddp(input): the module's forward as the forward of one DDP
  // step, with `input` moved to device_ids[0] and the output to
  // output_device. Throws c10::Error (as LibTorch modules do) when the
  // module type has no forward(Tensor) known to the wrapper.
  torch::Tensor forward(const torch::Tensor& input);
  torch::Tensor operator()(const torch::Tensor& input) { return forward(input); }

  // Runs `forward` (the model's forward pass, for modules with other
  // signatures, possibly with the loss) as the forward of one DDP step and
  // returns its result. The backward that follows reduces gradients,
  // unless inside a NoSync scope.
  template <typename Fn>
  auto Forward(Fn&& forward) -> decltype(forward()) {
    const absl::Time start = BeginForward();
    auto output = forward();
    EndForward(start);
    return output;
  }

  // While alive, forwards run without gradient synchronization, so
  // gradients accumulate locally (PyTorch's `with ddp.no_sync():`).
  class NoSyncScope {
   public:
    explicit NoSyncScope(DistributedDataParallel* ddp) : ddp_(ddp) {
      ddp_->sync_ = false;
    }
    ~NoSyncScope() { ddp_->sync_ = true; }
    NoSyncScope(const NoSyncScope&) = delete;
    NoSyncScope& operator=(const NoSyncScope&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  NoSyncScope NoSync() { return NoSyncScope(this); }

  // Replaces the default all-reduce of gradient buckets (PyTorch's
  // register_comm_hook); see Reducer::RegisterCommHook for the errors.
  absl::Status RegisterCommHook(std::shared_ptr<CommHook> hook) {
    return reducer_->RegisterCommHook(std::move(hook));
  }

  // The wrapped module (PyTorch's `ddp.module`), and its parameters.
  torch::nn::Module& module() { return *module_; }
  std::shared_ptr<torch::nn::Module> module_ptr() const { return module_; }
  std::vector<torch::Tensor> parameters(bool recurse = true) const {
    return module_->parameters(recurse);
  }
  torch::OrderedDict<std::string, torch::Tensor> named_parameters(
      bool recurse = true) const {
    return module_->named_parameters(recurse);
  }
  // PyTorch's ddp.state_dict(): parameters and buffers named "module.<name>"
  // (torch.save of it is what PyTorch DDP users checkpoint).
  StateDict state_dict() const;
  // Loads parameters and buffers from `state`, whose names may carry the
  // "module." prefix or not (see LoadStateDict).
  absl::Status load_state_dict(const StateDict& state);

  int rank() const { return backend_->rank(); }
  int world_size() const { return backend_->world_size(); }

  // Where the last synchronized step's time went.
  StepTimings last_step_timings() const { return reducer_->last_timings(); }

  const Reducer& reducer() const { return *reducer_; }

  // Before applying a step (optimizer.step()): whether the buffer broadcast
  // of its forward and every gradient collective of its synchronized
  // backward completed without error (Reducer::CheckStepCollectives). On a
  // device backend the forward and the backward only ordered the streams
  // after them; this is where the host learns their outcome, and waits for
  // the device. The backend's status when one failed: the step must be
  // dropped.
  absl::Status CheckStep();

  // The collective error behind the last failed step (a buffer broadcast
  // before forward, a gradient all-reduce, a SyncBatchNorm's statistics),
  // so the caller can tell a lost peer (UNAVAILABLE, DEADLINE_EXCEEDED,
  // ABORTED) from a bug; OK if none.
  absl::Status communication_error() const;

 private:
  friend class UnevenInputs;

  template <typename M, typename = void>
  struct HasTensorForward : std::false_type {};
  template <typename M>
  struct HasTensorForward<
      M, std::enable_if_t<std::is_convertible_v<
             decltype(std::declval<M&>().forward(
                 std::declval<const torch::Tensor&>())),
             torch::Tensor>>> : std::true_type {};

  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> CreateImpl(
      std::shared_ptr<torch::nn::Module> module,
      std::function<torch::Tensor(const torch::Tensor&)> forward,
      Backend* backend, DdpOptions options, Clock* clock);
  DistributedDataParallel(
      std::shared_ptr<torch::nn::Module> module,
      std::function<torch::Tensor(const torch::Tensor&)> forward,
      Backend* backend, DdpOptions options, Clock* clock);

  absl::Time BeginForward();
  void EndForward(absl::Time start);
  // Broadcasts the buffers from `root`, ordered before the forward's work
  // (BroadcastTensorsOrdered), keeping its Works for CheckStep; throws
  // (c10::Error) on a failure known at once, after recording it.
  void BroadcastBuffers(int root);
  // Waits for the buffer broadcasts not yet checked and forgets them; the
  // first failure, recorded as broadcast_error_.
  absl::Status CheckBufferBroadcasts();

  std::shared_ptr<torch::nn::Module> module_;
  const std::function<torch::Tensor(const torch::Tensor&)> module_forward_;
  Backend* const backend_;
  const DdpOptions options_;
  Clock* const clock_;
  // Where the parameters are (the first's): small collectives' tensors go
  // there.
  torch::Device device_{torch::kCPU};
  std::vector<torch::Tensor> buffers_;
  std::vector<std::shared_ptr<SyncBatchNormImpl>> sync_batch_norms_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
  // What the next backward divides summed gradients by (set per forward).
  int64_t divisor_ = 1;
  // Set while an UnevenInputs scope is active: every forward tells the
  // ranks that ran out of data what to shadow.
  UnevenInputs* uneven_ = nullptr;
  absl::Status broadcast_error_;
  // The buffer broadcasts of the last synchronized forward, until checked.
  std::vector<std::shared_ptr<Work>> buffer_works_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_DISTRIBUTED_DATA_PARALLEL_H_
