// Bounded polling for tests whose condition is checked by an RPC or reads
// state that another thread updates, pausing between checks.
#ifndef GRADSYNC_TESTS_TESTING_EVENTUALLY_H_
#define GRADSYNC_TESTS_TESTING_EVENTUALLY_H_

#include <algorithm>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradsync {

// Calls `condition` until it returns true (then true) or `bound` passes
// (then false). Between calls it pauses, from 100 us doubling up to 10 ms,
// so a wait on a loaded machine leaves the cores to the code under test.
inline bool Eventually(const std::function<bool()>& condition,
                       absl::Duration bound = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + bound;
  absl::Duration pause = absl::Microseconds(100);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(pause);
    pause = std::min(2 * pause, absl::Milliseconds(10));
  }
  return true;
}

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_EVENTUALLY_H_
