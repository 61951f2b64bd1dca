#include "worker/ddp/tensor_broadcast.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <vector>

#include "common/status_macros.h"
#include "worker/backend/work.h"
#include "worker/ddp/tensor_buffer.h"

namespace gradsync {
namespace {

// Tensors (indices into the caller's list) that travel in one broadcast.
struct Bucket {
  c10::Device device = c10::Device(c10::kCPU);
  at::ScalarType dtype = at::kFloat;
  std::vector<size_t> members;
  int64_t bytes = 0;
};

// The buckets, in the order of each one's first tensor: the same on every
// rank, since every rank passes the same dtypes, devices and sizes.
std::vector<Bucket> PlanBuckets(const std::vector<at::Tensor>& tensors,
                                int64_t bucket_bytes) {
  std::vector<Bucket> buckets;
  std::vector<size_t> open;  // per (device, dtype) seen: its last bucket
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& tensor = tensors[i];
    if (tensor.numel() == 0) continue;
    const int64_t bytes = tensor.numel() * tensor.element_size();
    Bucket* bucket = nullptr;
    for (size_t& b : open) {
      if (buckets[b].device != tensor.device() ||
          buckets[b].dtype != tensor.scalar_type()) {
        continue;
      }
      if (buckets[b].bytes + bytes > bucket_bytes) {
        buckets.push_back({tensor.device(), tensor.scalar_type(), {}, 0});
        b = buckets.size() - 1;
      }
      bucket = &buckets[b];
      break;
    }
    if (bucket == nullptr) {
      buckets.push_back({tensor.device(), tensor.scalar_type(), {}, 0});
      open.push_back(buckets.size() - 1);
      bucket = &buckets.back();
    }
    bucket->members.push_back(i);
    bucket->bytes += bytes;
  }
  return buckets;
}

// `bucket`'s tensors as one flat tensor, in order.
at::Tensor Flatten(const Bucket& bucket, const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  parts.reserve(bucket.members.size());
  for (size_t i : bucket.members) parts.push_back(tensors[i].reshape({-1}));
  return at::cat(parts);
}

// One bucket: its tensors flattened into one on the root (a lone
// contiguous tensor is itself), broadcast into a flat tensor of that size on
// the other ranks, and copied out of it there once `work`'s stream
// order (SynchronizeStream) allows. The flat tensor receives into
// uninitialized memory only where the copies wait for the outcome on the
// host (a host backend); else it starts as this rank's own values.
absl::StatusOr<std::shared_ptr<Work>> BroadcastBucket(
    Backend* backend, const Bucket& bucket,
    const std::vector<at::Tensor>& tensors, absl::Duration timeout,
    int root) {
  const at::Tensor& first = tensors[bucket.members.front()];
  const bool in_place = bucket.members.size() == 1 && first.is_contiguous();
  const bool receives = !in_place && backend->rank() != root;
  at::Tensor flat;
  if (in_place) {
    flat = first;
  } else if (receives && !backend->stream_ordered()) {
    flat = at::empty({bucket.bytes / first.element_size()}, first.options());
  } else {
    flat = Flatten(bucket, tensors);
  }
  GS_ASSIGN_OR_RETURN(Buffer buffer, ToBuffer(flat));
  std::shared_ptr<Work> work = backend->Broadcast(buffer, root);
  // The copies below may be queued before the broadcast ran: the caching
  // allocator keeps `flat` until the communication stream is past it.
  RecordStream(flat, *work);
  const absl::Status synchronized =
      work->SynchronizeStream(buffer.stream, timeout);
  if (!synchronized.ok()) {
    backend->Settle(*work, timeout);  // before `flat` goes
    return synchronized;
  }
  if (!receives) return work;
  int64_t offset = 0;
  for (size_t i : bucket.members) {
    const at::Tensor& tensor = tensors[i];
    tensor.copy_(flat.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
    offset += tensor.numel();
  }
  return work;
}

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<Work>>> BroadcastTensorsOrdered(
    Backend* backend, const std::vector<at::Tensor>& tensors,
    absl::Duration timeout, int root, int64_t bucket_bytes) {
  c10::NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> works;
  for (const Bucket& bucket : PlanBuckets(tensors, bucket_bytes)) {
    GS_ASSIGN_OR_RETURN(std::shared_ptr<Work> work,
                        BroadcastBucket(backend, bucket, tensors, timeout, root));
    works.push_back(std::move(work));
  }
  return works;
}

absl::Status BroadcastTensors(Backend* backend,
                              const std::vector<at::Tensor>& tensors,
                              absl::Duration timeout, int root,
                              int64_t bucket_bytes) {
  GS_ASSIGN_OR_RETURN(
      std::vector<std::shared_ptr<Work>> works,
      BroadcastTensorsOrdered(backend, tensors, timeout, root, bucket_bytes));
  absl::Status status;
  for (const std::shared_ptr<Work>& work : works) {
    // After a failure, the broadcasts still running end before their
    // buffers go.
    if (status.ok()) {
      status = backend->Await(*work, timeout);
    } else {
      backend->Settle(*work, timeout);
    }
  }
  return status;
}

}  // namespace gradsync
