#include "server/heartbeat_policer.h"

#include <algorithm>

namespace gradsync {

absl::Time HeartbeatPolicer::Admit(int heartbeats, const Asked& asked,
                                   absl::Time now) {
  if (asked.members <= 0 || asked.rate <= 0) {
    last_ = absl::InfinitePast();  // full again once an interval is told
    return now;
  }
  const double capacity = kBurstPerMember * asked.members;
  const double fill = kTolerance * asked.rate;  // heartbeats a second
  if (last_ == absl::InfinitePast()) {
    tokens_ = capacity;
  } else {
    const double elapsed =
        absl::ToDoubleSeconds(std::max(absl::ZeroDuration(), now - last_));
    tokens_ = std::min(capacity, tokens_ + fill * elapsed);
  }
  last_ = now;
  tokens_ -= heartbeats;
  if (tokens_ >= 0) return now;
  ++held_;
  return now + absl::Seconds(-tokens_ / fill);
}

}  // namespace gradsync
