// Copies of tensors from one rank to every rank, coalesced: what DDP's
// initial state, its buffers before each forward, uneven inputs' shadow
// state and the training-state transfer of a healed rank go through.
#ifndef GRADSYNC_WORKER_DDP_TENSOR_BROADCAST_H_
#define GRADSYNC_WORKER_DDP_TENSOR_BROADCAST_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"

namespace gradsync {

// The most bytes one coalesced broadcast carries (PyTorch's
// broadcast_coalesced for module buffers takes 250 MB): the extra memory a
// call needs, on the tensors' device.
inline constexpr int64_t kBroadcastBucketBytes = int64_t{256} << 20;

// Copies rank `root`'s `tensors` to every rank. A collective: every rank
// passes tensors of the same dtypes, devices and sizes in the same order.
// Tensors of one dtype and device travel together, in one broadcast of a
// flat copy per `bucket_bytes` (a tensor larger than that travels alone; a
// lone contiguous tensor as it is), so a model's buffers cost one
// collective per dtype, not one each; empty tensors cost none. Returns once the values are in place on this rank (on a
// GPU: the broadcasts have completed and the copies out of them are queued
// on the current stream). On error, the first one (no later broadcast is
// issued); the tensors then hold unspecified values. Thread-safe as far as
// the backend is; the tensors must not be used meanwhile.
absl::Status BroadcastTensors(Backend* backend,
                              const std::vector<at::Tensor>& tensors,
                              absl::Duration timeout, int root = 0,
                              int64_t bucket_bytes = kBroadcastBucketBytes);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_TENSOR_BROADCAST_H_
