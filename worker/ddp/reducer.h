// The gradient reducer behind DistributedDataParallel: buckets gradients and
// all-reduces each bucket as soon as its gradients are ready, while the rest
// of backward runs. Its flow reads as four verbs:
//   autograd hook -> MarkVariableReady -> MarkBucketReady -> FinalizeBackward
#ifndef GRADSYNC_WORKER_DDP_REDUCER_H_
#define GRADSYNC_WORKER_DDP_REDUCER_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/backend/backend.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/step_timings.h"
#include "worker/ddp/torch_compat.h"

namespace gradsync {

struct ReducerOptions {
  // Size limit of the first bucket (it holds the last layers, whose
  // gradients are ready first, so small means communication starts early).
  int64_t first_bucket_bytes = int64_t{1} << 20;
  // Size limit of every later bucket.
  int64_t bucket_cap_bytes = int64_t{25} << 20;
  // Gradients are views into the buckets: no copy in or out.
  bool gradient_as_bucket_view = false;
  // Parameters that get no gradient in a backward pass are reduced as zeros
  // instead of stalling the step (costs a scan per step).
  bool find_unused_parameters = false;
  // How long FinalizeBackward waits for the bucket all-reduces.
  absl::Duration timeout = absl::Minutes(30);
};

// Thread-safety: hooks may run on autograd threads; every method is
// thread-safe. Lifetime: must outlive every backward pass over its
// parameters; `backend` and `clock` must outlive it.
class Reducer {
 public:
  // `params` (at least one) in registration order, with their `names`
  // (for errors).
  Reducer(std::vector<std::string> names, std::vector<torch::Tensor> params,
          Backend* backend, ReducerOptions options,
          Clock* clock = RealClock::Get());
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Replaces the default all-reduce with `hook` (PyTorch's
  // register_comm_hook). FAILED_PRECONDITION once a hook is registered or a
  // synchronized backward has run (ranks must agree on how every step is
  // reduced); INVALID_ARGUMENT for a null hook.
  absl::Status RegisterCommHook(std::shared_ptr<CommHook> hook);
  // The hook in use ("allreduce" unless one was registered).
  std::string comm_hook_name() const;

  // Starts an iteration after a forward pass that took `forward`: the next
  // backward pass reduces gradients, each bucket's sum divided by `divisor`
  // (the world size, or fewer ranks under uneven inputs), or with `sync`
  // false (no_sync) only accumulates them locally. A backward pass that was
  // not prepared fails (the model was called directly, not through DDP).
  void PrepareForBackward(bool sync, absl::Duration forward, int64_t divisor);

  // For a rank that has run out of data under uneven inputs (Join): issues
  // the collectives of one synchronized backward with zero gradients (every
  // bucket through the hook, summed and divided by `divisor`, and the
  // bucket rebuild after the first step), so the ranks still training are
  // matched. Leaves this rank's gradients alone. The backend's status when a
  // collective fails; FAILED_PRECONDITION inside a backward pass.
  absl::Status ShadowBackward(int64_t divisor);

  // Timings of the last synchronized step.
  StepTimings last_timings() const;

  // The parameter indices of each bucket, in reduction order.
  std::vector<std::vector<size_t>> bucket_assignment() const;

  // Whether buckets have been rebuilt in gradient-ready order.
  bool buckets_rebuilt() const;

  // Whether every collective of the synchronized backward passes since the
  // last call (each bucket's, through the hook) completed without error,
  // waiting on the host for those still in flight. A device backend's
  // stream waits say nothing about that (Work::SynchronizeStream): an NCCL
  // all-reduce aborted half way still lets the stream run on, so a step must
  // not be applied unless this is OK. OK, or the first failure (the
  // backend's status), which also becomes communication_error(). Clears the
  // record.
  absl::Status CheckStepCollectives();

  // The collective error that failed the last backward (the backend's
  // status: UNAVAILABLE when a peer left, ...); OK when it did not fail
  // that way. Reset by PrepareForBackward.
  absl::Status communication_error() const;

 private:
  struct Bucket {
    std::vector<size_t> variables;
    torch::Tensor contents;             // flat, one dtype and device
    std::vector<torch::Tensor> views;   // per variable, shaped like it
    size_t pending = 0;                 // variables not yet ready
    std::optional<BucketFuture> future;  // the hook's, once launched
    int64_t wire_bytes = 0;
    absl::Time launched;
  };
  // Where a parameter's gradient lives.
  struct Slot {
    size_t bucket = 0;
    size_t index = 0;  // within the bucket
  };

  void AutogradHook(size_t variable);
  void MarkVariableReady(size_t variable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkBucketReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands bucket `b`, holding `contents` (its own, or zeros to shadow), to
  // the hook.
  void LaunchBucket(size_t b, const torch::Tensor& contents)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for every launched bucket's future, in order, copying each result
  // into `contents` (one per bucket); the first error. After an error no
  // collective of the step runs on: the failed bucket's are ended
  // (Backend::Settle) and the later buckets' futures drained, so `contents`
  // may go.
  absl::Status AwaitBuckets(const std::vector<torch::Tensor>& contents,
                            StepTimings* timings)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinalizeBackward();
  // Drops every bucket's future, ending a collective still in flight (a
  // failed step's later buckets; BucketFuture::Drain).
  void DrainBucketsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills last_timings_'s communication figures from the step's Works once
  // every one has finished (else leaves them for CheckStepCollectives).
  void CompleteTimingsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Assigns parameters, taken in `order`, to buckets.
  void InitializeBuckets(const std::vector<size_t>& order)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the first step: buckets in the order gradients became ready, as
  // rank 0 saw it (broadcast), so every rank agrees.
  absl::Status RebuildBuckets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes each parameter's grad the view into its bucket.
  void PointGradientsAtBuckets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> UnreadyNamesLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> names_;
  const std::vector<torch::Tensor> params_;
  Backend* const backend_;
  const ReducerOptions options_;
  Clock* const clock_;
  // Keeps the hooked grad accumulators alive.
  std::vector<GradAccumulatorPtr> grad_accumulators_;

  mutable absl::Mutex mu_;
  std::vector<Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<CommHook> hook_ ABSL_GUARDED_BY(mu_);
  bool hook_registered_ ABSL_GUARDED_BY(mu_) = false;
  // Whether a synchronized backward has run (no hook may be registered
  // after it).
  bool synchronized_once_ ABSL_GUARDED_BY(mu_) = false;
  // This iteration: whether a forward through DDP prepared the next
  // backward, whether it reduces (and by what the sums are divided), which
  // variables are ready, the next bucket to launch, and whether
  // FinalizeBackward is queued.
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;
  bool sync_ ABSL_GUARDED_BY(mu_) = false;
  int64_t divisor_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<bool> ready_ ABSL_GUARDED_BY(mu_);
  size_t next_bucket_ ABSL_GUARDED_BY(mu_) = 0;
  bool finalize_queued_ ABSL_GUARDED_BY(mu_) = false;
  // The order variables became ready in, recorded until buckets rebuild.
  std::vector<size_t> ready_order_ ABSL_GUARDED_BY(mu_);
  bool rebuilt_ ABSL_GUARDED_BY(mu_) = false;
  // Timing marks of this iteration.
  absl::Duration forward_ ABSL_GUARDED_BY(mu_);
  absl::Time backward_start_ ABSL_GUARDED_BY(mu_);
  absl::Time last_hook_ ABSL_GUARDED_BY(mu_);
  absl::Time first_launch_ ABSL_GUARDED_BY(mu_);
  StepTimings last_timings_ ABSL_GUARDED_BY(mu_);
  absl::Status communication_error_ ABSL_GUARDED_BY(mu_);
  // The collectives waited for since the last CheckStepCollectives, with
  // their bucket.
  struct IssuedWork {
    size_t bucket = 0;
    std::shared_ptr<Work> work;
  };
  std::vector<IssuedWork> step_works_ ABSL_GUARDED_BY(mu_);
  // The last gradient hook on the real clock, which the Works' run times
  // are on (last_hook_ is on clock_).
  absl::Time last_hook_wall_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_REDUCER_H_
