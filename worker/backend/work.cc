#include "worker/backend/work.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsync {

std::shared_ptr<Work> Work::Done(uint64_t sequence, absl::Status status) {
  auto work = std::make_shared<Work>(sequence);
  work->Finish(std::move(status));
  return work;
}

bool Work::IsCompleted() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status Work::Wait(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("collective #", sequence_, " did not finish within ",
                     absl::FormatDuration(timeout)));
  }
  return status_;
}

absl::Status Work::status() const {
  absl::MutexLock lock(&mu_);
  if (!done_) return absl::UnknownError("the collective has not finished");
  return status_;
}

absl::Time Work::started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

absl::Time Work::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

void Work::SetRunTime(absl::Time started, absl::Time ended) {
  absl::MutexLock lock(&mu_);
  started_ = started;
  ended_ = ended;
}

void Work::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  GS_CHECK(!done_) << "collective #" << sequence_ << " finished twice";
  done_ = true;
  status_ = std::move(status);
}

}  // namespace gradsync
