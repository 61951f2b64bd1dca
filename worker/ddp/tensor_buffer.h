// Tensors as the raw buffers backends take.
#ifndef GRADSYNC_WORKER_DDP_TENSOR_BUFFER_H_
#define GRADSYNC_WORKER_DDP_TENSOR_BUFFER_H_

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace gradsync {

// A Buffer over a contiguous tensor's storage (it must outlive the
// collective). INVALID_ARGUMENT for non-contiguous tensors and dtypes the
// backends do not carry.
absl::StatusOr<Buffer> ToBuffer(const torch::Tensor& tensor);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_TENSOR_BUFFER_H_
