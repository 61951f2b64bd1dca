// What the health manager takes from the wire, checked before any state is
// touched: a member reference (Monitor.Heartbeat, ReportCompletion) and a
// worker's metrics. Stateless; thread-safe.
#ifndef GRADSYNC_SERVER_HEALTH_WIRE_H_
#define GRADSYNC_SERVER_HEALTH_WIRE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "common/error_text.h"
#include "proto/gradsync/v1/health.pb.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

// INVALID_ARGUMENT, naming the field, for a malformed job id, a round below
// 1, a negative rank or an over-long incarnation id.
absl::Status ValidateMemberRef(const v1::MemberRef& member);

// INVALID_ARGUMENT, naming the field, for negative counters or sizes, more
// events or buckets than one heartbeat may carry, over-long texts, or
// malformed times and durations.
absl::Status ValidateMetrics(const v1::WorkerMetrics& m);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HEALTH_WIRE_H_
