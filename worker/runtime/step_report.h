// What a training loop reports after each optimizer step: plain values, no
// LibTorch, so that the heartbeat side (Telemetry) need not compile against
// it.
#ifndef GRADSYNC_WORKER_RUNTIME_STEP_REPORT_H_
#define GRADSYNC_WORKER_RUNTIME_STEP_REPORT_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/ddp/replica_digest.h"
#include "worker/ddp/step_timings.h"

namespace gradsync {

// Where one optimizer step's time went; the DDP fields stay zero without a
// backend.
struct StepReport {
  int64_t step = 0;  // 1-based
  int64_t epoch = 0;
  // This rank's loss (the mean over its micro-batches).
  double loss = 0;
  absl::Duration step_time;
  StepTimings ddp;
  // The host's time, after the micro-batches returned, until the step's
  // collectives were known good and its loss read (on a GPU: the wait for
  // the device to finish the step), and then to apply the update (on a
  // GPU: to queue it).
  absl::Duration commit_wait;
  absl::Duration update;
  // The replica's fingerprint after this step, on the steps it is taken
  // (TrainerConfig::fingerprint_every); null on the others.
  std::shared_ptr<const ReplicaDigest> fingerprint;
  // Whether rank 0 writes a checkpoint after this step (set on every rank:
  // the others may wait for it in their next collective).
  bool checkpoint = false;
  // With an exact global batch: the micro-batches this rank ran, of the
  // step's micro_batches_per_step, and what one took on average: those
  // before the last, whose backward does not synchronize (forward and
  // backward, on CUDA measured from and to an idle device); a lone one
  // without the wait for the step's collectives. Zero without an exact
  // global batch.
  int micro_batches = 0;
  int micro_batches_per_step = 0;
  absl::Duration micro_batch_time;
};

// OK when `report` of a step that trained `samples` samples can be
// reported: a step of 1 or more, no negative count or duration, finite
// durations, micro_batches within micro_batches_per_step. Otherwise
// InvalidArgument naming the first bad field: a report that would put
// nonsense into the status or into the step times the timeouts set
// themselves from. The loss is not checked (a diverged loop's NaN is worth
// showing).
absl::Status CheckStepReport(const StepReport& report, int64_t samples);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_STEP_REPORT_H_
