#include "common/self_set_timeout.h"

#include <algorithm>

namespace gradsync {

SelfSetTimeout::SelfSetTimeout(std::optional<absl::Duration> fixed, Bounds bounds)
    : fixed_(fixed), bounds_(bounds) {}

void SelfSetTimeout::AddStep(absl::Duration step_time) {
  if (fixed_.has_value() || step_time <= absl::ZeroDuration()) return;
  if (ring_.size() < static_cast<size_t>(kSamples)) {
    ring_.push_back(step_time);
  } else {
    ring_[count_ % kSamples] = step_time;
  }
  ++count_;
}

absl::Duration SelfSetTimeout::value() const {
  if (fixed_.has_value()) return *fixed_;
  if (!self_set()) return bounds_.fallback;
  std::vector<absl::Duration> sorted = ring_;
  const size_t p99 = (sorted.size() * 99) / 100;
  std::nth_element(sorted.begin(), sorted.begin() + p99, sorted.end());
  return std::clamp(sorted[p99] * bounds_.factor, bounds_.min, bounds_.max);
}

}  // namespace gradsync
