// Communication hooks: how DistributedDataParallel reduces one bucket of
// gradients across ranks. PyTorch's register_comm_hook, in C++: the reducer
// hands a hook each bucket as soon as its gradients are ready (a bucket in)
// and waits, at the end of backward, for the hook's future (the reduced
// bucket out). The built-ins are those PyTorch users know: plain all-reduce
// (the default), fp16 and bf16 compression; PowerSGD is in powersgd_hook.h.
#ifndef GRADSYNC_WORKER_DDP_COMM_HOOK_H_
#define GRADSYNC_WORKER_DDP_COMM_HOOK_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/backend/work.h"

namespace gradsync {

// One bucket of gradients as a hook sees it.
struct GradBucket {
  // Position in reduction order (0 first, the same on every rank).
  size_t index = 0;
  // Whether this is the last bucket of the backward pass.
  bool is_last = false;
  // The bucket's gradients, flat: contiguous, one dtype and device. A hook
  // may change it in place (e.g. add its error feedback).
  torch::Tensor buffer;
  // Per parameter, a view of `buffer` shaped like the parameter, in the
  // bucket's order.
  std::vector<torch::Tensor> gradients;
  // The summed gradients are divided by this to average them: the world
  // size, or the number of ranks still training under uneven inputs (Join).
  int64_t divisor = 1;
  // Set by the hook: the bytes this rank puts into collectives for the
  // bucket (the heartbeats' per-bucket bytes, so compression shows).
  int64_t wire_bytes = 0;
};

// The pending result of a hook: a chain of collectives, each followed by a
// step that runs on the waiting thread once it completed, ending in the
// reduced bucket (a flat tensor of the bucket's size, dtype and device). A
// movable value; Wait() runs the chain once. Not thread-safe.
class BucketFuture {
 public:
  // What runs after a collective completed: the next stage (another
  // collective), or the result (Value()).
  using Continuation = std::function<absl::StatusOr<BucketFuture>()>;

  // A future that is already done.
  static BucketFuture Value(torch::Tensor reduced);
  static BucketFuture Error(absl::Status status);
  // Done when `work` is: then `then` gives the next stage or the value.
  static BucketFuture After(std::shared_ptr<Work> work, Continuation then);

  // Runs the chain to its end and returns the reduced bucket, or the first
  // error known by then: a collective's status (UNAVAILABLE when a peer
  // left, ...), or DEADLINE_EXCEEDED when the whole chain took longer than
  // `timeout`. Each collective is waited for through
  // Work::SynchronizeStream(stream): a CPU backend's on the host, with its
  // status; a device backend's (NCCL) only orders `stream` (the bucket's
  // stream; nullptr: the default one) after it, so the stages after it are
  // queued behind it and the host does not learn whether it succeeded:
  // check works() before using the result for good (Reducer::CheckStep).
  absl::StatusOr<torch::Tensor> Wait(absl::Duration timeout,
                                     void* stream = nullptr);

  // The collectives Wait went through, in order.
  const std::vector<std::shared_ptr<Work>>& works() const { return issued_; }

  // Waits (at most `timeout`) for the collective in flight without starting
  // the chain's later stages, and ends it if it still runs then
  // (Backend::Await: `backend`, the one it runs on, is aborted): for
  // dropping a future whose step failed, so that nothing writes into
  // buffers about to be reused or freed.
  void Drain(Backend* backend, absl::Duration timeout);

  // The backend's sequence number of the chain's first collective (0 when
  // it has none), so the heartbeats can tell which bucket a collective
  // carried.
  uint64_t sequence() const { return sequence_; }

 private:
  BucketFuture() = default;

  std::shared_ptr<Work> work_;
  Continuation then_;
  absl::StatusOr<torch::Tensor> value_;
  uint64_t sequence_ = 0;
  std::vector<std::shared_ptr<Work>> issued_;
};

// Reduces buckets across ranks. The reducer calls Run once per bucket per
// synchronized backward (and, for a rank that has joined under uneven
// inputs, with a bucket of zeros), in bucket order, from the thread running
// backward; a hook must issue the same collectives on every rank, in the
// same order, whatever the gradients hold. Thread-compatible: one DDP model
// drives it. Lifetime: registered with one DDP model, which keeps it alive.
class CommHook {
 public:
  virtual ~CommHook() = default;
  // "allreduce", "fp16_compress", ...
  virtual std::string name() const = 0;
  // Starts reducing `bucket` over `backend` (which outlives the returned
  // future) and sets bucket.wire_bytes.
  virtual BucketFuture Run(Backend* backend, GradBucket& bucket) = 0;
};

// PyTorch's default: the bucket all-reduced and divided by bucket.divisor.
class AllReduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  BucketFuture Run(Backend* backend, GradBucket& bucket) override;
};

// PyTorch's fp16_compress_hook and bf16_compress_hook: the bucket is cast to
// float16 (bfloat16), divided by bucket.divisor, all-reduced (summed) in that
// type and cast back into the bucket, in that order, as PyTorch's hooks do.
// Half the bytes on the wire for float32 gradients.
class CompressHook final : public CommHook {
 public:
  // `dtype`: torch::kFloat16 or torch::kBFloat16.
  explicit CompressHook(torch::ScalarType dtype) : dtype_(dtype) {}
  std::string name() const override;
  BucketFuture Run(Backend* backend, GradBucket& bucket) override;

 private:
  const torch::ScalarType dtype_;
};

// Starts an all-reduce of `tensor` (contiguous) over `backend` with `op`,
// for hooks; a Work finished with INVALID_ARGUMENT when the tensor cannot be
// communicated.
std::shared_ptr<Work> AllReduceTensor(Backend* backend,
                                      const torch::Tensor& tensor, ReduceOp op);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_COMM_HOOK_H_
