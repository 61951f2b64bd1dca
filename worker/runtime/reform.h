// A round that ends on purpose: the coordinator asked its members to re-form
// it at a step boundary (a node waits to join a round that runs below the
// job's MAX), and every member stopped after the same committed step. The
// training loop returns this status; RunElastic rejoins at once without
// counting a recovery, and the next round admits the new node with nothing
// lost. When a member's agreement to stop fails instead (ReformVoteFailed),
// it cannot tell a peer that agreed and rejoined first from one that died:
// RunElastic counts a recovery unless the next round says that the old one
// ended as planned (Assignment.follows_planned_reform).
#ifndef GRADSYNC_WORKER_RUNTIME_REFORM_H_
#define GRADSYNC_WORKER_RUNTIME_REFORM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace gradsync {

// ABORTED (so code that does not know it still rejoins), marked as a
// re-form after committed step `step`.
absl::Status ReformAtStepBoundary(int64_t step);

// ABORTED, marked as a re-form after committed step `step` whose
// agreement (the members' all-reduce of whether any was asked) failed on
// this rank with `why`, after the coordinator had asked this rank.
absl::Status ReformVoteFailed(int64_t step, const absl::Status& why);

// Whether `status` came from ReformAtStepBoundary or ReformVoteFailed.
bool IsReformAtStepBoundary(const absl::Status& status);

// Whether `status` came from ReformVoteFailed.
bool IsReformVoteFailed(const absl::Status& status);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_REFORM_H_
