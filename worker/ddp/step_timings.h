// Where the time of one synchronized step went, as the reducer measures it:
// plain structs, no LibTorch, so that the heartbeats can carry them without
// compiling against it.
#ifndef GRADSYNC_WORKER_DDP_STEP_TIMINGS_H_
#define GRADSYNC_WORKER_DDP_STEP_TIMINGS_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace gradsync {

// One bucket's all-reduce in a step.
struct BucketTiming {
  int index = 0;
  int64_t bytes = 0;
  // The backend's sequence number of the all-reduce (Work::sequence()).
  uint64_t sequence = 0;
  // From launch until FinalizeBackward saw it complete (an upper bound when
  // it completed while an earlier bucket was being waited for); on CUDA,
  // until the caller's stream was ordered after it (the host does not wait).
  absl::Duration allreduce;
};

// Where the time of one synchronized step went.
struct StepTimings {
  absl::Duration forward;
  // From the end of forward to the last gradient hook.
  absl::Duration backward_compute;
  // From the first bucket's all-reduce start to the last one's end.
  absl::Duration communication;
  // The part of `communication` that overlapped backward compute.
  absl::Duration hidden_communication;
  int buckets = 0;
  // When the first bucket became ready and its all-reduce started: across
  // ranks, a rank that is consistently later than the others is a
  // straggler.
  absl::Time first_bucket_ready;
  std::vector<BucketTiming> bucket_timings;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_STEP_TIMINGS_H_
