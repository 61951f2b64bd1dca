// Failpoints: named places in the code where a test can make the process
// exit at once, as a crash would, to pin what recovery does at exactly that
// moment (etcd's gofail and TiKV's fail-rs serve the same purpose). They
// are disarmed by default, where passing one costs an atomic load; only a
// binary's main() arms them (gradsync-worker --failpoint), never a library.
//
//   // in the code under test:
//   Failpoint(kFailpointStateTransfer);
//   // in main(), from a flag:
//   GS_RETURN_IF_ERROR(ArmFailpoint("state_transfer:2"));
//
// Thread-safe. Process-wide: one failpoint may be armed at a time.
#ifndef GRADSYNC_COMMON_FAILPOINT_H_
#define GRADSYNC_COMMON_FAILPOINT_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// In the middle of copying a round's training state to its members
// (BroadcastTrainingState): after the step counters, before the tensors.
inline constexpr absl::string_view kFailpointStateTransfer = "state_transfer";
// Right after a training step committed (its optimizer step applied): a
// worker that dies mid-training, at a step a test chooses.
inline constexpr absl::string_view kFailpointStep = "step";

// The exit code of a process that hit an armed failpoint.
inline constexpr int kFailpointExitCode = 86;

// Arms the failpoint `spec` names: "NAME" exits on its first pass, "NAME:N"
// on its N-th. INVALID_ARGUMENT, arming nothing, for an unknown name or a
// count that is not a positive integer.
absl::Status ArmFailpoint(absl::string_view spec);

// A pass through failpoint `name`: when it is the armed one and this is the
// pass it was armed for, logs "failpoint NAME hit" and exits the process
// with kFailpointExitCode (no destructors, no flushing beyond stderr).
void Failpoint(absl::string_view name);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_FAILPOINT_H_
