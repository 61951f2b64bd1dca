#include "common/clock.h"

#include "absl/time/clock.h"
#include "common/logging.h"

namespace gradsync {

RealClock* RealClock::Get() {
  static RealClock* clock = new RealClock();
  return clock;
}

absl::Time RealClock::Now() const { return absl::Now(); }

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  GS_CHECK(d >= absl::ZeroDuration()) << "a clock cannot go back";
  absl::MutexLock lock(&mu_);
  now_ += d;
}

}  // namespace gradsync
