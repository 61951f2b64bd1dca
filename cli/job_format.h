// How the CLI shows jobs: readable tables and JSON. Pure functions of the
// status and the current time, so tests can pin the output.
#ifndef GRADSYNC_CLI_JOB_FORMAT_H_
#define GRADSYNC_CLI_JOB_FORMAT_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/jobs.pb.h"

namespace gradsync {

// One line per job: JOB STATE ROUND WORLD NODES BACKEND AGE.
std::string FormatJobsTable(const std::vector<v1::JobStatus>& jobs,
                            absl::Time now);

// A job's summary followed by the per-rank table of its members (rank, node,
// host, pid, state, step, samples/s, step time, comm time, lag, last seen),
// the diagnosis (desync, hang, stragglers, why members were lost), then
// waiting and spare processes. `gradsync status` prints it once and
// `gradsync watch` on every update.
std::string FormatJobStatus(const v1::JobStatus& job, absl::Time now);

// JSON for `jobs --json`: {"jobs": [summary, ...]}.
std::string JobsToJson(const std::vector<v1::JobStatus>& jobs);

// JSON for `status --json`: the summary fields (job, state, round,
// world_size, backend, ..., ended) plus diagnosis {hang, desync,
// stragglers[]} and members[], waiting[] and spares[], each with rank, host,
// state, state_reason, lag_seconds and, once it heartbeats, step,
// samples_per_second, step timings, collectives, memory and buckets.
std::string JobStatusToJson(const v1::JobStatus& job);

// The same JSON on one line (for `watch --json`: one document per update).
std::string JobStatusToJsonLine(const v1::JobStatus& job);

// What `create` prints: the job and its token (for the workers'
// --token_file or GRADSYNC_TOKEN), or that the coordinator has no tokens.
std::string FormatCreatedJob(const v1::CreateJobResponse& created);
// JSON for `create --json`: the summary fields plus "token" ("" when the
// coordinator has no tokens).
std::string CreatedJobToJson(const v1::CreateJobResponse& created);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_JOB_FORMAT_H_
