// Running your training loop as a member of a gradsync job: joining through
// the coordinator (or under `gradsync launch`), a process group per round,
// heartbeats with your steps, and in-place recovery when a peer is lost.
// The public header (link //gradsync in Bazel, gradsync::gradsync in
// CMake); see worker/runtime/run_job.h for JobOptions, Round, Trainer and
// RunJob. Call gradsync::ConfigureMutexChecks() first in main()
// (common/mutex_checks.h: abseil's lock-order check in release builds).
#ifndef GRADSYNC_GRADSYNC_JOB_H_
#define GRADSYNC_GRADSYNC_JOB_H_

#include "common/mutex_checks.h"
#include "worker/runtime/run_job.h"

#endif  // GRADSYNC_GRADSYNC_JOB_H_
