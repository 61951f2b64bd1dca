// Copies of tensors from one rank to every rank, coalesced: what DDP's
// initial state, its buffers before each forward, uneven inputs' shadow
// state and the training-state transfer of a healed rank go through.
#ifndef GRADSYNC_WORKER_DDP_TENSOR_BROADCAST_H_
#define GRADSYNC_WORKER_DDP_TENSOR_BROADCAST_H_

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/backend/work.h"

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
// collective per dtype, not one each; empty tensors cost none. Returns once
// every broadcast has completed and the values are in place on this rank (on
// a GPU: the copies out of them are queued on the current stream). On error,
// the first one; the tensors then hold a mix of this rank's data and the
// root's. Thread-safe as far as the backend is; the tensors must not be used
// meanwhile.
absl::Status BroadcastTensors(Backend* backend,
                              const std::vector<at::Tensor>& tensors,
                              absl::Duration timeout, int root = 0,
                              int64_t bucket_bytes = kBroadcastBucketBytes);

// BroadcastTensors without the host's wait where the backend is stream
// ordered (Backend::stream_ordered: NCCL), as PyTorch's DDP syncs its
// buffers before each forward: each broadcast runs after the work queued on
// its tensors' current stream, and the copies out of it are queued there
// after it (Work::SynchronizeStream), so work queued later on that stream
// sees the root's values. On a host backend it waits as BroadcastTensors.
// Returns the broadcasts' Works: whether each succeeded is known only from
// them (Wait), and a caller must check them before committing anything
// computed from the tensors. An error the host knows already (a refused
// tensor, a host backend's failure, a broadcast that failed before its
// copies were queued) is returned instead, and no later broadcast is
// issued. Either way the tensors hold a mix of this rank's data and the
// root's, never uninitialized memory: where the copies may run before the
// outcome is known, a receiving rank broadcasts into a flat copy of its own
// values.
absl::StatusOr<std::vector<std::shared_ptr<Work>>> BroadcastTensorsOrdered(
    Backend* backend, const std::vector<at::Tensor>& tensors,
    absl::Duration timeout, int root = 0,
    int64_t bucket_bytes = kBroadcastBucketBytes);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_TENSOR_BROADCAST_H_
