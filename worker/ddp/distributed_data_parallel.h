// DistributedDataParallel for LibTorch modules: what PyTorch's DDP does, on a
// gradsync Backend. Wrap the module, run each forward through Forward(), call
// backward() as usual: gradients arrive averaged across ranks, and buckets
// are all-reduced while backward is still running.
//
//   auto ddp = DistributedDataParallel::Create(model, backend, options);
//   torch::Tensor loss = (*ddp)->Forward([&] { return loss_fn(model->forward(x), y); });
//   loss.backward();
//   optimizer.step();
#ifndef GRADSYNC_WORKER_DDP_DISTRIBUTED_DATA_PARALLEL_H_
#define GRADSYNC_WORKER_DDP_DISTRIBUTED_DATA_PARALLEL_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/backend/backend.h"
#include "worker/ddp/reducer.h"

namespace gradsync {

struct DdpOptions {
  ReducerOptions reducer;
  // Broadcast rank 0's buffers (e.g. batch-norm statistics) before every
  // forward.
  bool broadcast_buffers = true;
  // Create copies rank 0's parameters and buffers to every rank (PyTorch's
  // behaviour). Off when the caller copies the state itself, e.g. with
  // BroadcastTrainingState from a recovered round's source rank, which need
  // not be rank 0.
  bool broadcast_initial_state = true;
};

// Not thread-safe: one training loop drives it. Lifetime: the module, the
// backend and the clock must outlive it.
class DistributedDataParallel {
 public:
  // Checks that every rank holds the same parameters (count, names, shapes,
  // dtypes; FAILED_PRECONDITION naming the first mismatch), then copies rank
  // 0's parameters and buffers to every rank (unless
  // options.broadcast_initial_state is off). Collective: every rank calls
  // it.
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      std::shared_ptr<torch::nn::Module> module, Backend* backend,
      DdpOptions options = DdpOptions(), Clock* clock = RealClock::Get());

  // The wrapped module (PyTorch's `ddp.module`).
  torch::nn::Module& module() { return *module_; }

  // Runs `forward` (the model's forward pass, usually with the loss) as the
  // forward of one DDP step and returns its result. The backward that
  // follows reduces gradients, unless inside a NoSync scope.
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

  // Where the last synchronized step's time went.
  StepTimings last_step_timings() const { return reducer_->last_timings(); }

  const Reducer& reducer() const { return *reducer_; }

  // The collective error behind the last failed step (a buffer broadcast
  // before forward, or a gradient all-reduce), so the caller can tell a lost
  // peer (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED) from a bug; OK if none.
  absl::Status communication_error() const;

 private:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          Backend* backend, DdpOptions options, Clock* clock);

  absl::Time BeginForward();
  void EndForward(absl::Time start);

  std::shared_ptr<torch::nn::Module> module_;
  Backend* const backend_;
  const DdpOptions options_;
  Clock* const clock_;
  std::vector<torch::Tensor> buffers_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
  absl::Status broadcast_error_;
};

// Copies rank `root`'s `tensors` to every rank (collective), in order.
absl::Status BroadcastTensors(Backend* backend,
                              const std::vector<torch::Tensor>& tensors,
                              absl::Duration timeout, int root = 0);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_DISTRIBUTED_DATA_PARALLEL_H_
