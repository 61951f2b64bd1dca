// Tensors as the raw buffers backends take.
#ifndef GRADSYNC_WORKER_DDP_TENSOR_BUFFER_H_
#define GRADSYNC_WORKER_DDP_TENSOR_BUFFER_H_

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/work.h"

namespace gradsync {

// A Buffer over a contiguous tensor's storage (it must outlive the
// collective); for a CUDA tensor its stream is the device's current stream
// (CurrentStream). INVALID_ARGUMENT for non-contiguous tensors and dtypes
// the backends do not carry.
absl::StatusOr<Buffer> ToBuffer(const at::Tensor& tensor);

// The current CUDA stream (a cudaStream_t) of `tensor`'s device, which the
// caller's kernels are queued on: what collectives order after and what
// waits on them. nullptr for CPU tensors, and in builds against a LibTorch
// without CUDA (GRADSYNC_TORCH_CUDA unset: the backend's compute stream is
// used then).
void* CurrentStream(const at::Tensor& tensor);

// Tells LibTorch's CUDA caching allocator that `tensor`'s memory is in use
// on the stream `work` runs on (Work::stream(): NCCL's communication
// stream) until the work queued there now has run, so that freeing the
// tensor meanwhile cannot hand its memory to another kernel
// (c10d's recordStream). Nothing for CPU tensors or host backends.
void RecordStream(const at::Tensor& tensor, const Work& work);

// The devices a c10::ivalue::Future completed with `tensors` must name: each
// CUDA device among them once (none for CPU tensors). Such a future records
// an event on each device's current stream when it completes, and a
// consumer's wait() orders the consumer's stream after it.
std::vector<c10::Device> FutureDevices(const std::vector<at::Tensor>& tensors);

// Runs `fn` with CUDA device `device_index`'s current stream set to the one
// `work` ran on (Work::stream()), restoring the previous one after: a CUDA
// future that `fn` completes then records its events after the collective.
// Only `fn` for host backends, CPU tensors (`device_index` < 0) and builds
// against a LibTorch without CUDA.
void RunOnWorkStream(const Work& work, int device_index,
                     const std::function<void()>& fn);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_TENSOR_BUFFER_H_
