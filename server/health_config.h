// HealthConfig: the coordinator-wide health settings HealthManager is made
// with (the coordinator's main() sets them from its flags).
#ifndef GRADSYNC_SERVER_HEALTH_CONFIG_H_
#define GRADSYNC_SERVER_HEALTH_CONFIG_H_

#include <optional>

#include "absl/time/time.h"
#include "server/heartbeat_shedder.h"

namespace gradsync {

// Coordinator-wide defaults for the health settings a JobConfig leaves zero.
struct HealthConfig {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  int missed_heartbeats = 3;
  absl::Duration straggler_threshold = absl::Milliseconds(100);
  // The hang timeout of a job that sets none follows its step times
  // (SelfSetTimeout): hang_timeout_factor x their 99th percentile, within
  // [min_hang_timeout, max_hang_timeout]; hang_timeout until enough steps
  // were reported.
  absl::Duration hang_timeout = absl::Seconds(30);
  absl::Duration min_hang_timeout = absl::Seconds(1);
  absl::Duration max_hang_timeout = absl::Minutes(10);
  double hang_timeout_factor = 10;
  // How long a member whose heartbeat stream broke may take to heartbeat
  // again on a new one before it is LOST; unset: the job's missed-heartbeat
  // window (interval x missed heartbeats); zero: LOST at once.
  std::optional<absl::Duration> reconnect_grace;
  // Queues whose delays ReportQueueDelay gives (0: only the largest).
  int completion_queues = 0;
  // Slowing heartbeats down past the coordinator's capacity.
  HeartbeatSheddingConfig shedding;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HEALTH_CONFIG_H_
