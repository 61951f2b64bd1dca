#include "server/round_lifecycle.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::string_view RoundPhaseName(RoundPhase phase) {
  switch (phase) {
    case RoundPhase::kForming:
      return "forming";
    case RoundPhase::kLastCall:
      return "last call";
    case RoundPhase::kRunning:
      return "running";
    case RoundPhase::kReformRequested:
      return "re-form requested";
    case RoundPhase::kSuperseded:
      return "superseded";
    case RoundPhase::kEnded:
      return "ended";
  }
  return "unknown";
}

bool RoundPhaseMayBecome(RoundPhase from, RoundPhase to) {
  using P = RoundPhase;
  if (from == P::kEnded) return false;
  switch (to) {
    case P::kLastCall:
      return from == P::kForming || from == P::kSuperseded;
    case P::kForming:
      return from == P::kLastCall;
    case P::kRunning:
      return from == P::kForming || from == P::kLastCall ||
             from == P::kSuperseded;
    case P::kReformRequested:
      return from == P::kRunning;
    case P::kSuperseded:
      // From kLastCall only back below min nodes in a re-forming round.
      return RoundRuns(from) || from == P::kLastCall;
    case P::kEnded:
      return true;
  }
  return false;
}

absl::string_view RoundEventName(RoundEvent::Kind kind) {
  switch (kind) {
    case RoundEvent::Kind::kClosed:
      return "closed";
    case RoundEvent::Kind::kSuperseded:
      return "superseded";
    case RoundEvent::Kind::kReformRequested:
      return "re-form requested";
    case RoundEvent::Kind::kJobEnded:
      return "job ended";
    case RoundEvent::Kind::kForgotten:
      return "forgotten";
  }
  return "unknown";
}

absl::Status CheckRoundIsLive(absl::string_view job_id, int64_t asked,
                              int64_t latest, bool latest_runs) {
  if (asked < latest || (asked == latest && !latest_runs)) {
    return absl::AbortedError(absl::StrCat(
        "round ", asked, " of job '", job_id, "' is over (latest round: ",
        latest, ", ",
        latest_runs ? "running" : "superseded, the next one is forming",
        "): rejoin to get a new assignment"));
  }
  if (asked > latest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", asked, " of job '", job_id,
        "' has not closed (latest closed round: ", latest, ")"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
