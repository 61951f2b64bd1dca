// Bounded polling for tests whose condition is checked by an RPC or reads
// state that another thread updates: the check itself paces the loop.
#ifndef GRADSYNC_TESTS_TESTING_EVENTUALLY_H_
#define GRADSYNC_TESTS_TESTING_EVENTUALLY_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradsync {

// Calls `condition` until it returns true (then true) or `bound` passes
// (then false).
inline bool Eventually(const std::function<bool()>& condition,
                       absl::Duration bound = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + bound;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
  }
  return true;
}

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_EVENTUALLY_H_
