// A round that ends on purpose: the coordinator asked its members to re-form
// it at a step boundary (a node waits to join a round that runs below the
// job's MAX), and every member stopped after the same committed step. The
// training loop returns this status; RunElastic rejoins at once without
// counting a recovery, and the next round admits the new node with nothing
// lost.
#ifndef GRADSYNC_WORKER_RUNTIME_REFORM_H_
#define GRADSYNC_WORKER_RUNTIME_REFORM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace gradsync {

// ABORTED (so code that does not know it still rejoins), marked as a
// re-form after committed step `step`.
absl::Status ReformAtStepBoundary(int64_t step);

// Whether `status` came from ReformAtStepBoundary.
bool IsReformAtStepBoundary(const absl::Status& status);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_REFORM_H_
