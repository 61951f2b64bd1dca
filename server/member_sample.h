// MemberSample: one member of a monitored job as the Prometheus exposition
// reads it (HealthManager::ForEachMember, server/http/prometheus_metrics.cc).
// A view: its pointers are valid only during the ForEachMember callback.
#ifndef GRADSYNC_SERVER_MEMBER_SAMPLE_H_
#define GRADSYNC_SERVER_MEMBER_SAMPLE_H_

#include <string>

#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

// One member as the Prometheus exposition sees it (see ForEachMember).
struct MemberSample {
  const std::string* job_id;
  int rank;
  const std::string* host;
  v1::MemberState state;
  bool heard;          // whether a heartbeat arrived yet
  absl::Duration age;  // since the last heartbeat (or monitoring start)
  absl::Duration lag;  // median first-bucket lag; 0 when unknown
  const v1::WorkerMetrics* metrics;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_MEMBER_SAMPLE_H_
