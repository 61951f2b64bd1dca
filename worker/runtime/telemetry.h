// Turns what the training loop and its backend observe into the heartbeats a
// HealthReporter sends: step metrics after every step; the collective
// counters read as each heartbeat is sent (HealthReporter::SetLiveFields),
// so that a rank stuck inside a step shows which collective it is waiting on
// as of that heartbeat; memory use refreshed between steps.
#ifndef GRADSYNC_WORKER_RUNTIME_TELEMETRY_H_
#define GRADSYNC_WORKER_RUNTIME_TELEMETRY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "worker/backend/observed_backend.h"
#include "worker/ddp/replica_digest.h"
#include "worker/runtime/health_reporter.h"
#include "worker/runtime/step_report.h"

namespace gradsync {

// Thread-safe. `reporter` and `backend` must outlive it; the refresh thread
// runs, and the reporter reads `backend`'s counters, from construction to
// destruction (one Telemetry per reporter at a time).
class Telemetry {
 public:
  // `gpu_memory`, when set, tells the GPU memory in use (bytes) for the
  // heartbeats; it is called on the reporting threads.
  Telemetry(HealthReporter* reporter, ObservedBackend* backend,
            std::function<int64_t()> gpu_memory = nullptr,
            absl::Duration refresh_interval = absl::Seconds(1));
  ~Telemetry();
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  // Reports one finished step in which this process consumed `samples`.
  // Returns FAILED_PRECONDITION with the coordinator's reason once the
  // coordinator has failed the job (e.g. ranks desynchronized), so the
  // training loop stops at its next step boundary. It is checked only here,
  // between steps: a rank blocked inside a collective is ended by the
  // backend's timeout, not by this.
  absl::Status OnStep(const StepReport& report, int64_t samples);

  // Queues the fingerprint of the replica as committed step `step` left it
  // for the next heartbeat (or the completion report), apart from a step's
  // report (StepReport::fingerprint carries one with it): a Python loop's,
  // and the one it takes after its last step.
  void OnFingerprint(int64_t step, const ReplicaDigest& digest);

  // Sets the worker state (STARTING, TRAINING, STOPPING, ...) and sends it.
  void SetState(v1::WorkerState state);

  // Records the error training ended with and sends it.
  void SetError(const std::string& error);

  // Records how this member's start in the round went; sent with every
  // heartbeat from the next step on.
  void SetRoundStart(absl::Duration process_group, absl::Duration state_transfer,
                     absl::Duration first_step);

 private:
  // Fills the collective counters and memory, then hands the snapshot to
  // the reporter.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The parts of a step's report: step timings and throughput; the
  // micro-batch load (an exact global batch); bucket stats and the step's
  // collectives.
  void SetStepTimingsLocked(const StepReport& report, int64_t samples)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetMicroBatchesLocked(const StepReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetCollectivesLocked(const StepReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a replica fingerprint, with the tensors' names the first time.
  void AddFingerprintLocked(int64_t step, const ReplicaDigest& digest)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshLoop(absl::Duration interval);

  HealthReporter* const reporter_;
  ObservedBackend* const backend_;
  const std::function<int64_t()> gpu_memory_;
  absl::Mutex mu_;
  v1::WorkerMetrics metrics_ ABSL_GUARDED_BY(mu_);
  double samples_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  // With an exact global batch: a moving average of the compute time of
  // one micro-batch (MicroBatchLoad.seconds).
  double micro_batch_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  bool fingerprint_names_sent_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread refresher_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_TELEMETRY_H_
