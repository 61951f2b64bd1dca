// The digest of named tensors as a replica fingerprint carries it
// (ReplicaDigest): the rule, in one place, for gradsync-worker's replicas
// (FingerprintReplica, replica_fingerprint.h) and for a Python loop's
// (gradsync.elastic, through python/ext/job.cc).
#ifndef GRADSYNC_WORKER_DDP_TENSOR_DIGEST_H_
#define GRADSYNC_WORKER_DDP_TENSOR_DIGEST_H_

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "worker/ddp/replica_digest.h"

namespace gradsync {

// Per tensor, the sum of its elements' bit patterns read as integers of the
// element's own size, wrapping in that width and then widened to 64 bits
// (so any single flipped bit changes it); an empty tensor's is 0. Computed
// where the tensors are (one reduction per tensor) with one copy of the
// results to the host (on a GPU: a single synchronization). `names` name
// `tensors` one to one. INVALID_ARGUMENT when the counts differ or a tensor
// is undefined; INTERNAL for an error inside LibTorch. Thread-compatible:
// the caller must not be changing the tensors meanwhile.
absl::StatusOr<ReplicaDigest> DigestTensors(std::vector<std::string> names,
                                            const std::vector<at::Tensor>& tensors);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_TENSOR_DIGEST_H_
