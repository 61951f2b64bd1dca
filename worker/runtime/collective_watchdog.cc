#include "worker/runtime/collective_watchdog.h"

#include <pthread.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsync {

CollectiveWatchdog::CollectiveWatchdog(ObservedBackend* backend,
                                       const CollectiveWatchdogOptions& options)
    : backend_(backend),
      options_(options),
      timeout_(std::nullopt,
               SelfSetTimeout::Bounds{std::min(options.min, options.max),
                                      options.max, options.max,
                                      options.factor}) {
  if (options_.factor > 0 && options_.check_every > absl::ZeroDuration()) {
    thread_ = std::thread([this] { Run(); });
  }
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::AddStep(absl::Duration step_time, bool checkpoint) {
  absl::MutexLock lock(&mu_);
  const bool was_self_set = timeout_.self_set();
  timeout_.AddStep(step_time);
  after_checkpoint_ = checkpoint;
  if (!was_self_set && timeout_.self_set()) {
    GS_LOG(INFO) << "collective timeout self-set to "
                 << absl::FormatDuration(
                        absl::Trunc(timeout_.value(), absl::Milliseconds(1)))
                 << " (" << options_.factor
                 << " x the 99th percentile of this round's step times, "
                    "within "
                 << absl::FormatDuration(options_.min) << " and "
                 << absl::FormatDuration(options_.max) << ")";
  }
}

std::optional<absl::Duration> CollectiveWatchdog::TimeoutLocked() const {
  if (options_.factor <= 0 || after_checkpoint_ || !timeout_.self_set()) {
    return std::nullopt;
  }
  return timeout_.value();
}

std::optional<absl::Duration> CollectiveWatchdog::timeout() const {
  absl::ReaderMutexLock lock(&mu_);
  return TimeoutLocked();
}

absl::Status CollectiveWatchdog::fired() const {
  absl::ReaderMutexLock lock(&mu_);
  return fired_;
}

void CollectiveWatchdog::Check() {
  const std::optional<ObservedBackend::InFlight> oldest =
      backend_->oldest_in_flight();
  if (!oldest.has_value()) return;
  const absl::Duration waited = options_.clock->Now() - oldest->issued;
  {
    absl::MutexLock lock(&mu_);
    const std::optional<absl::Duration> timeout = TimeoutLocked();
    if (!fired_.ok() || !timeout.has_value() || waited <= *timeout) return;
    fired_ = absl::DeadlineExceededError(absl::StrCat(
        "collective #", oldest->sequence, " has not completed after ",
        absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))),
        ", longer than the self-set collective timeout of ",
        absl::FormatDuration(absl::Trunc(*timeout, absl::Milliseconds(1))),
        " (", options_.factor,
        " x the 99th percentile of this round's step times)"));
    GS_LOG(WARNING) << fired_.message() << ": aborting the "
                    << backend_->name() << " process group";
  }
  backend_->Abort();
}

void CollectiveWatchdog::Run() {
  pthread_setname_np(pthread_self(), "gs-watchdog");  // for stacks and top
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.check_every)) {
        return;
      }
    }
    Check();
  }
}

}  // namespace gradsync
