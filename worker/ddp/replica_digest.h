// A replica's fingerprint as the heartbeats carry it: plain values, no
// LibTorch (computed by FingerprintReplica, replica_fingerprint.h).
#ifndef GRADSYNC_WORKER_DDP_REPLICA_DIGEST_H_
#define GRADSYNC_WORKER_DDP_REPLICA_DIGEST_H_

#include <cstdint>
#include <string>
#include <vector>

namespace gradsync {

// Per tensor of a replica (its parameters, then its optimizer state), a
// checksum: the sum of the elements' bit patterns read as integers of the
// element's size, in 64 bits (wrapping), so that any single flipped bit
// changes it. Ranks whose replicas are identical have equal digests.
struct ReplicaDigest {
  // "fc1.weight", ..., "fc1.weight:momentum_buffer", ...
  std::vector<std::string> names;
  std::vector<uint64_t> values;  // one per name
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_REPLICA_DIGEST_H_
