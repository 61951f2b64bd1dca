// The handle of an asynchronous collective: completion, wait with a timeout,
// and the error the operation ended with (stored by the backend thread that
// ran it, returned by every Wait).
#ifndef GRADSYNC_WORKER_BACKEND_WORK_H_
#define GRADSYNC_WORKER_BACKEND_WORK_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

// Thread-safe. Shared (std::shared_ptr) between the caller and the backend
// that completes it; Finish() is called exactly once.
class Work {
 public:
  // `sequence` is the backend's collective number (1, 2, ...) for messages.
  explicit Work(uint64_t sequence) : sequence_(sequence) {}
  virtual ~Work() = default;

  // A Work that has already finished with `status`.
  static std::shared_ptr<Work> Done(uint64_t sequence, absl::Status status);

  // Whether the operation has finished (successfully or not).
  bool IsCompleted() const;

  // Blocks until the operation finishes and returns its status, or returns
  // DEADLINE_EXCEEDED when `timeout` passes first (the operation goes on).
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) const;

  // Orders `stream` (a device stream: a cudaStream_t; nullptr is the
  // default stream) after the collective, on the device, without blocking
  // the host (c10d's Work::wait for NCCL): work queued on `stream` after
  // this call runs once the collective ended, successfully or not. A CPU
  // backend's Work waits on the host (Wait(timeout)) and returns its status.
  // A device Work returns the collective's error only when it already
  // failed: one that comes later fails the Work (Wait, status) but not the
  // stream's work, so a caller that commits what the collective produced
  // must check Wait() first.
  virtual absl::Status SynchronizeStream(void* stream,
                                         absl::Duration timeout) const {
    (void)stream;
    return Wait(timeout);
  }

  // The device stream the collective runs on (a cudaStream_t: NCCL's
  // communication stream), so that a caller can tell a caching allocator
  // that its tensors are in use there until then (recordStream); nullptr
  // for a host backend.
  virtual void* stream() const { return nullptr; }

  // The status once completed; UNKNOWN before.
  absl::Status status() const;

  uint64_t sequence() const { return sequence_; }

  // When the operation itself ran, on its transport or device: from its
  // start to its end, not the time it waited behind earlier ones. Both
  // absl::InfiniteFuture() until the backend set them (before Finish), and
  // for a Work that never ran (an argument error, an abort before it
  // started).
  absl::Time started() const;
  absl::Time ended() const;
  // Called by the backend before Finish, once the operation ran.
  void SetRunTime(absl::Time started, absl::Time ended);

  // Called by the backend once: records the outcome and wakes waiters.
  void Finish(absl::Status status);

 private:
  const uint64_t sequence_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time started_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time ended_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_WORK_H_
