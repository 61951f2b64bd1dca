// Time as a dependency: production code reads the time through a Clock so
// tests can step it deterministically (see FakeClock).
#ifndef GRADSYNC_COMMON_CLOCK_H_
#define GRADSYNC_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

// Source of the current time. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // The current time.
  virtual absl::Time Now() const = 0;
};

// The system's wall clock. Thread-safe; the instance lives forever.
class RealClock final : public Clock {
 public:
  // A process-wide instance; never destroyed.
  static RealClock* Get();
  absl::Time Now() const override;
};

// A clock that only moves when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  // Starts at `start` (default: 2026-01-01 00:00:00 UTC).
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1767225600));
  absl::Time Now() const override;
  // Moves the clock forward by `d` (must be >= 0).
  void Advance(absl::Duration d);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_CLOCK_H_
