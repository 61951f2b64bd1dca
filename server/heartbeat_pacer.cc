#include "server/heartbeat_pacer.h"

#include <algorithm>

#include "common/logging.h"

namespace gradsync {

HeartbeatPacer::HeartbeatPacer(double per_second)
    : spacing_(absl::Seconds(1) / per_second) {
  GS_CHECK(per_second > 0) << "a heartbeat cap of " << per_second;
}

absl::Time HeartbeatPacer::Turn(absl::string_view job_id, int heartbeats,
                                absl::Time now) {
  if (heartbeats <= 0) return now;
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  Line& line = lines_[job_id];
  // This job is counted among those sharing the cap, waiting or not.
  const int64_t sharing = static_cast<int64_t>(lines_.size());
  line.last_turn = std::max(now, line.next);
  line.next = line.last_turn + spacing_ * (sharing * heartbeats);
  ends_.emplace(line.next, std::string(job_id));
  return line.last_turn;
}

void HeartbeatPacer::ExpireLocked(absl::Time now) {
  while (!ends_.empty() && ends_.top().first <= now) {
    auto line = lines_.find(ends_.top().second);
    // An older end of a line that has moved on is skipped.
    if (line != lines_.end() && line->second.next <= now) lines_.erase(line);
    ends_.pop();
  }
}

HeartbeatPacer::Waits HeartbeatPacer::WaitsAt(absl::Time now) const {
  Waits waits;
  absl::MutexLock lock(&mu_);
  for (const auto& [job, line] : lines_) {
    if (line.last_turn <= now) continue;
    const absl::Duration wait = line.last_turn - now;
    waits.jobs.emplace(job, wait);
    waits.longest = std::max(waits.longest, wait);
  }
  return waits;
}

}  // namespace gradsync
