#include "worker/runtime/reform.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

constexpr char kReformPayload[] = "type.gradsync.dev/reform_at_step_boundary";
constexpr char kVoteFailedPayload[] = "type.gradsync.dev/reform_vote_failed";

}  // namespace

absl::Status ReformAtStepBoundary(int64_t step) {
  absl::Status status = absl::AbortedError(absl::StrCat(
      "the round re-forms after step ", step,
      " to admit a node (every member committed that step)"));
  status.SetPayload(kReformPayload, absl::Cord(absl::StrCat(step)));
  return status;
}

absl::Status ReformVoteFailed(int64_t step, const absl::Status& why) {
  absl::Status status = absl::AbortedError(absl::StrCat(
      "the round re-forms after step ", step,
      " to admit a node, but this rank's agreement to stop failed (",
      why.ToString(), ")"));
  status.SetPayload(kReformPayload, absl::Cord(absl::StrCat(step)));
  status.SetPayload(kVoteFailedPayload, absl::Cord(why.ToString()));
  return status;
}

bool IsReformVoteFailed(const absl::Status& status) {
  return IsReformAtStepBoundary(status) &&
         status.GetPayload(kVoteFailedPayload).has_value();
}

bool IsReformAtStepBoundary(const absl::Status& status) {
  return absl::IsAborted(status) &&
         status.GetPayload(kReformPayload).has_value();
}

}  // namespace gradsync
