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
  // How long its collectives ran, each from its own start to its end on
  // the transport or device (a GPU's timing events), not counting the time
  // it waited behind earlier ones.
  absl::Duration allreduce;
};

// Where the time of one synchronized step went.
struct StepTimings {
  absl::Duration forward;
  // From the end of forward to the last gradient hook.
  absl::Duration backward_compute;
  // How long the step's collectives ran (the sum of their own run times;
  // they run one at a time).
  absl::Duration communication;
  // What the step waited for communication after its last gradient was
  // ready: from then to the last collective's true end (on a GPU, when the
  // device finished it, not when a stream was ordered after it).
  absl::Duration exposed_communication;
  // communication - exposed_communication, at least 0: the part of the
  // collectives' run time that overlapped backward compute (a lower bound:
  // exposed time may include waiting, not only running).
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
