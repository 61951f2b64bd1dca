#include "worker/ddp/comm_hook.h"

#include <torch/torch.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/ddp/tensor_buffer.h"

namespace gradsync {

BucketFuture BucketFuture::Value(torch::Tensor reduced) {
  BucketFuture future;
  future.value_ = std::move(reduced);
  return future;
}

BucketFuture BucketFuture::Error(absl::Status status) {
  BucketFuture future;
  future.value_ = std::move(status);
  return future;
}

BucketFuture BucketFuture::After(std::shared_ptr<Work> work,
                                 Continuation then) {
  BucketFuture future;
  future.sequence_ = work->sequence();
  future.work_ = std::move(work);
  future.then_ = std::move(then);
  return future;
}

absl::StatusOr<torch::Tensor> BucketFuture::Wait(absl::Duration timeout,
                                                 void* stream) {
  const absl::Time deadline = absl::Now() + timeout;
  while (work_ != nullptr) {
    absl::Status status =
        work_->SynchronizeStream(stream, deadline - absl::Now());
    issued_.push_back(work_);
    std::shared_ptr<Work> done = std::move(work_);
    Continuation then = std::move(then_);
    work_ = nullptr;
    if (!status.ok()) return status;
    absl::StatusOr<BucketFuture> next;
    try {
      next = then();
    } catch (const c10::Error& e) {
      next = absl::InternalError(e.what_without_backtrace());
    }
    if (!next.ok()) return next.status();
    const uint64_t first = sequence_;
    std::vector<std::shared_ptr<Work>> issued = std::move(issued_);
    *this = std::move(*next);
    sequence_ = first;
    issued_.insert(issued_.begin(), issued.begin(), issued.end());
  }
  return value_;
}

void BucketFuture::Drain(Backend* backend, absl::Duration timeout) {
  if (work_ != nullptr) backend->Await(*work_, timeout).IgnoreError();
  work_ = nullptr;
  then_ = nullptr;
  value_ = absl::CancelledError("the bucket's reduction was abandoned");
}

std::shared_ptr<Work> AllReduceTensor(Backend* backend,
                                      const torch::Tensor& tensor,
                                      ReduceOp op) {
  absl::StatusOr<Buffer> buffer = ToBuffer(tensor);
  if (!buffer.ok()) return Work::Done(0, buffer.status());
  std::shared_ptr<Work> work = backend->AllReduce(*buffer, op);
  // The reducer only orders the streams after it: the tensor (a hook's
  // temporary, say) may be freed before the device is done with it.
  RecordStream(tensor, *work);
  return work;
}

BucketFuture AllReduceHook::Run(Backend* backend, GradBucket& bucket) {
  torch::Tensor buffer = bucket.buffer;
  bucket.wire_bytes = buffer.numel() * buffer.element_size();
  ReduceOp op = ReduceOp::kAverage;  // the backend divides as it reduces
  if (bucket.divisor != backend->world_size()) {
    torch::NoGradGuard no_grad;
    buffer.div_(static_cast<double>(bucket.divisor));
    op = ReduceOp::kSum;
  }
  return BucketFuture::After(AllReduceTensor(backend, buffer, op),
                             [buffer]() -> absl::StatusOr<BucketFuture> {
                               return BucketFuture::Value(buffer);
                             });
}

std::string CompressHook::name() const {
  return dtype_ == torch::kBFloat16 ? "bf16_compress" : "fp16_compress";
}

BucketFuture CompressHook::Run(Backend* backend, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  torch::Tensor buffer = bucket.buffer;
  torch::Tensor compressed =
      buffer.to(dtype_).div_(static_cast<double>(bucket.divisor));
  bucket.wire_bytes = compressed.numel() * compressed.element_size();
  return BucketFuture::After(
      AllReduceTensor(backend, compressed, ReduceOp::kSum),
      [buffer, compressed]() -> absl::StatusOr<BucketFuture> {
        torch::NoGradGuard no_grad;
        buffer.copy_(compressed);  // in place: no second full-size buffer
        return BucketFuture::Value(buffer);
      });
}

}  // namespace gradsync
