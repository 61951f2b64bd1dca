// The self-set timeout: how long a job's step may take before something is
// wrong, from the job's own step times.
#ifndef GRADSYNC_COMMON_SELF_SET_TIMEOUT_H_
#define GRADSYNC_COMMON_SELF_SET_TIMEOUT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/time.h"

namespace gradsync {

// A timeout that follows a round's step times: fixed when the job set one;
// otherwise `factor` x the 99th percentile of the newest kSamples step
// times, within [min, max], and `fallback` until kMinSamples were added.
// With the default bounds a job of 50 ms steps gets `min` (1 s), one of
// 10 s steps 100 s. The coordinator's hang diagnosis (no collective finished
// for that long) and a worker's collective watchdog (a collective in flight
// for that long) use it. A value; not thread-safe.
class SelfSetTimeout {
 public:
  static constexpr int kSamples = 256;
  static constexpr int kMinSamples = 8;
  struct Bounds {
    absl::Duration min = absl::Seconds(1);
    absl::Duration max = absl::Minutes(10);
    absl::Duration fallback = absl::Seconds(30);
    double factor = 10;
  };

  SelfSetTimeout(std::optional<absl::Duration> fixed, Bounds bounds);

  // One step of one rank took `step_time`.
  void AddStep(absl::Duration step_time);
  // The timeout now.
  absl::Duration value() const;
  // Whether value() follows the step times (false: fixed, the fallback, or
  // a factor of 0, which keeps the fallback for good).
  bool self_set() const {
    return !fixed_.has_value() && bounds_.factor > 0 && count_ >= kMinSamples;
  }

 private:
  const std::optional<absl::Duration> fixed_;
  const Bounds bounds_;
  std::vector<absl::Duration> ring_;  // the newest kSamples
  int64_t count_ = 0;                 // samples ever added
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_SELF_SET_TIMEOUT_H_
