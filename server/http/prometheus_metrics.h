// The coordinator's Prometheus metrics: jobs and members by state, rounds,
// per-rank training metrics and heartbeat age, heartbeats and RPCs.
#ifndef GRADSYNC_SERVER_HTTP_PROMETHEUS_METRICS_H_
#define GRADSYNC_SERVER_HTTP_PROMETHEUS_METRICS_H_

#include <string>

#include "server/health_manager.h"
#include "server/job_manager.h"
#include "server/rendezvous_manager.h"
#include "server/rpc_stats.h"

namespace gradsync {

// Renders every metric in the Prometheus text format. Thread-safe (reads
// each manager under its own locks).
std::string RenderMetrics(const JobManager& jobs,
                          const RendezvousManager& rendezvous,
                          const HealthManager& health, const RpcStats& rpcs);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HTTP_PROMETHEUS_METRICS_H_
