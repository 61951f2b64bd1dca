// How the CLI shows jobs: readable tables and JSON. Pure functions of the
// status and the current time, so tests can pin the output.
#ifndef GRADSYNC_WORKER_CLI_JOB_FORMAT_H_
#define GRADSYNC_WORKER_CLI_JOB_FORMAT_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

// One line per job: JOB STATE ROUND WORLD NODES BACKEND AGE.
std::string FormatJobsTable(const std::vector<v1::JobStatus>& jobs,
                            absl::Time now);

// A job's summary followed by a table of its members, then waiting and
// spare processes.
std::string FormatJobStatus(const v1::JobStatus& job, absl::Time now);

// JSON for `jobs --json`: {"jobs": [summary, ...]}.
std::string JobsToJson(const std::vector<v1::JobStatus>& jobs);

// JSON for `status --json`: the summary fields (job, state, round,
// world_size, backend, ...) plus members[], waiting[] and spares[], each with
// rank, host, state, ...
std::string JobStatusToJson(const v1::JobStatus& job);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_CLI_JOB_FORMAT_H_
