// Failpoints: named places in the code where a test makes something go
// wrong at exactly the moment it chooses, to pin what recovery does then
// (etcd's gofail and TiKV's fail-rs serve the same purpose). Some exit the
// process at once, as a crash would (Failpoint); others inject a fault that
// the code at that place carries out (FailpointFires: an NCCL collective
// that fails asynchronously, or hangs). They are disarmed by default, where
// passing one costs an atomic load; only a binary's main() arms them
// (gradsync-worker --failpoint), never a library.
//
//   // in the code under test:
//   Failpoint(kFailpointStateTransfer);
//   if (FailpointFires(kFailpointNcclHang)) { ...inject the hang... }
//   // in main(), from a flag:
//   GS_RETURN_IF_ERROR(ArmFailpoint("state_transfer:2,nccl_hang:40"));
//
// Thread-safe. Process-wide: several failpoints may be armed at once, each
// with its own count of passes.
#ifndef GRADSYNC_COMMON_FAILPOINT_H_
#define GRADSYNC_COMMON_FAILPOINT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// Exit failpoints.
// In the middle of copying a round's training state to its members
// (BroadcastTrainingState): after the step counters, before the tensors.
inline constexpr absl::string_view kFailpointStateTransfer = "state_transfer";
// Right after a training step committed (its optimizer step applied): a
// worker that dies mid-training, at a step a test chooses.
inline constexpr absl::string_view kFailpointStep = "step";

// Fault failpoints, passed once per NCCL collective this process issues
// (every communicator of every round): the N-th completes with an
// asynchronous error after the host moved on, or never completes (until
// the communicator is aborted). They apply only where the NCCL backend runs
// (--device=cuda or sim).
inline constexpr absl::string_view kFailpointNcclAsyncError = "nccl_async_error";
inline constexpr absl::string_view kFailpointNcclHang = "nccl_hang";
// Step-keyed fault failpoint: armed as NAME:STEP, it fires when passed with
// that training step (a step number, not a count of passes, so that a
// process that resumed mid-run still hits the step the test named). Right
// after a step commits, one bit of one parameter flips (silent data
// corruption, for divergence detection).
inline constexpr absl::string_view kFailpointCorruptParameters =
    "corrupt_parameters";
// Step-keyed: before the first collective of training step STEP the rank
// stands still, heartbeating, until its round is over (a real hang: unlike
// SIGSTOP, the coordinator still hears from it); it then fails the round
// and rejoins. Needs a coordinator.
inline constexpr absl::string_view kFailpointHang = "hang";

// The exit code of a process that hit an armed exit failpoint.
inline constexpr int kFailpointExitCode = 86;

// Arms the failpoints `spec` lists, comma-separated: "NAME" fires on its
// first pass, "NAME:N" on its N-th. INVALID_ARGUMENT, arming nothing, for
// an unknown name, a name listed twice or a count that is not a positive
// integer.
absl::Status ArmFailpoint(absl::string_view spec);

// Whether failpoint `name` is armed and has not fired yet.
bool FailpointArmed(absl::string_view name);

// A pass through failpoint `name`: true when it is armed and this is the
// pass it was armed for, after logging "failpoint NAME hit" to stderr; the
// caller carries out the fault. False otherwise, and on every later pass.
bool FailpointFires(absl::string_view name);

// A pass through step-keyed failpoint `name` at `step`: true, after logging
// "failpoint NAME hit", when it is armed for `step` and has not fired yet.
bool FailpointFiresAtStep(absl::string_view name, int64_t step);
// A pass through exit failpoint `name`: when it fires, exits the process
// with kFailpointExitCode (no destructors, no flushing beyond stderr).
void Failpoint(absl::string_view name);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_FAILPOINT_H_
