// Fingerprints a data-parallel replica (parameters and optimizer state)
// where its tensors are, so that the coordinator can compare replicas
// across ranks and catch one that silently stopped being a replica.
#ifndef GRADSYNC_WORKER_DDP_REPLICA_FINGERPRINT_H_
#define GRADSYNC_WORKER_DDP_REPLICA_FINGERPRINT_H_

#include "absl/status/statusor.h"
#include "worker/ddp/replica_digest.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace gradsync {

// The digest (DigestTensors, tensor_digest.h: one reduction per tensor on
// its device, one copy of the results to the host; on a GPU, a single
// synchronization) of `model`'s parameters (named_parameters order), then
// of `optimizer`'s state of each (SGD: momentum_buffer; Adam, AdamW:
// exp_avg, exp_avg_sq, max_exp_avg_sq), named "NAME:momentum_buffer", ...
// Call between steps, on the training thread. INTERNAL for an error inside
// LibTorch.
absl::StatusOr<ReplicaDigest> FingerprintReplica(
    const torch::nn::Module& model, const torch::optim::Optimizer& optimizer);

// Flips bit 20 (a mantissa bit) of the first element of `model`'s first
// float32 parameter, in place: the silent data corruption the failpoint
// corrupt_parameters injects. INTERNAL when the model has none.
absl::Status FlipOneParameterBit(torch::nn::Module& model);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_REPLICA_FINGERPRINT_H_
