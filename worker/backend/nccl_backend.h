// The NCCL backend, for device buffers, over the NcclDevice seam
// (nccl_device.h): the same code drives a GPU through CUDA and NCCL
// (cuda_nccl_device.h) and the simulated device (sim_device.h), on which its
// multi-rank behaviour, hangs and asynchronous errors are tested without a
// GPU.
//
// Bootstrap (Connect): rank 0 makes the communicator's unique id and
// publishes it through the Store; the others read it; the communicator is
// created non-blocking, so a rank that never arrives fails the creation
// after the timeout, and Abort() from another thread ends it at once.
//
// Execution: each collective waits (on the device, via an event) for the
// work already queued on the caller's stream (Buffer::stream, else the
// compute stream), then runs on the backend's own communication stream; an
// event recorded after it is the Work's end. Work::SynchronizeStream makes a
// caller's stream wait on that event without blocking the host; Work::Wait
// blocks the host until the Work is finished, which is when its result is
// known to be good or bad:
//  - a completion thread waits (blocking, not polling) for each end event in
//    turn, then asks the communicator for an asynchronous error: only then
//    is the Work finished OK. An error aborts the communicator and fails the
//    Work and every later one;
//  - a watchdog thread looks every 100 ms for asynchronous errors and for a
//    collective older than the timeout (a hung peer): either aborts the
//    communicator, which ends the collectives in flight; the completion
//    thread then fails every pending Work, each once its end event is done,
//    with a message naming the collective.
// So a Work is finished, OK or not, only once the device is done with its
// buffers: after Wait() returns the caller may free or reuse them, also
// after an abort (on the simulated device, whose buffers are host memory,
// an earlier finish let a freed bucket be written by the collective that
// the abort was still ending).
// After an abort every collective fails with ABORTED: the round must be
// re-formed with a new backend (a new communicator), which is recoverable.
#ifndef GRADSYNC_WORKER_BACKEND_NCCL_BACKEND_H_
#define GRADSYNC_WORKER_BACKEND_NCCL_BACKEND_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/nccl_faults.h"
#include "worker/backend/store.h"

namespace gradsync {

struct NcclOptions {
  // The device of this process; must outlive the backend (and its Works).
  NcclDevice* device = nullptr;
  // The stream (a device stream handle) whose queued work a collective waits
  // for when its buffer names none; nullptr is the legacy default stream
  // (for the simulated device: the host, whose work is already done).
  void* compute_stream = nullptr;
  // Faults injected into the communicator's collectives (tests and
  // failpoints); none when empty.
  CommFaultPlan faults;
};

// Thread-safe. Collectives may be issued from any thread; they run in the
// order their calls took the backend's issue lock. Lifetime: the backend
// lives as long as its round; its Works may outlive it (destroying it with
// collectives pending aborts them: they end CANCELLED once the device has).
class NcclBackend final : public Backend {
 public:
  // Checks the options; the communicator is made by Connect.
  // INVALID_ARGUMENT for a bad rank, world size or timeout, or no device.
  static absl::StatusOr<std::unique_ptr<NcclBackend>> Create(
      const BackendOptions& options, const NcclOptions& nccl_options);
  // Fails what is pending with CANCELLED (aborting a communicator with
  // collectives in flight), stops the threads, frees the communicator.
  ~NcclBackend() override;

  // Creates the communicator through `store` (used during the call only).
  // Blocks until every rank has joined: DEADLINE_EXCEEDED naming the wait
  // when they do not within options.timeout, ABORTED when Abort() was
  // called meanwhile, the store's or device's error otherwise. Once.
  absl::Status Connect(Store* store);

  std::string name() const override { return "nccl"; }
  bool stream_ordered() const override { return true; }
  std::shared_ptr<Work> AllReduce(Buffer buffer, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(Buffer buffer, int root) override;
  std::shared_ptr<Work> AllGather(Buffer input, Buffer output) override;
  std::shared_ptr<Work> Barrier() override;
  // ncclCommAbort, as the watchdog does on an error; also ends a Connect in
  // progress.
  void Abort() override;

 private:
  class EndedWork;
  struct Pending {
    std::shared_ptr<EndedWork> work;
    absl::Time start;
    std::string what;  // "allreduce #17 (rank 2 of 4, 1048576 float32)"
  };
  // Enqueues the collective on the communication stream.
  using IssueFn = std::function<absl::Status(NcclComm*, void* stream)>;

  NcclBackend(const BackendOptions& options, const NcclOptions& nccl_options);
  absl::Status AllocateResources();
  std::shared_ptr<Work> Launch(const char* collective, const Buffer& buffer,
                               const IssueFn& issue);
  absl::Status Enqueue(const Buffer& buffer, const IssueFn& issue,
                       NcclComm* comm, EndedWork* work)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);
  // Waits until the communicator's last call settled, at most until
  // `deadline`; ABORTED as soon as the backend is aborted.
  absl::Status AwaitSettled(const std::string& what, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CompletionLoop();
  void WatchdogLoop();
  void AbortLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NcclOptions nccl_options_;
  NcclDevice* const device_;
  // Made before Connect starts the communicator, freed by the destructor.
  void* comm_stream_ = nullptr;
  void* ready_event_ = nullptr;  // used under issue_mu_
  void* barrier_buffer_ = nullptr;
  std::thread completion_;
  std::thread watchdog_;

  // Serializes issuing (so the order is the same on every rank) and the
  // wait for a non-blocking enqueue to settle, without blocking mu_.
  absl::Mutex issue_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  absl::Mutex mu_;
  // Set by Connect, then kept until the destructor (Abort only aborts it).
  std::unique_ptr<NcclComm> comm_ ABSL_GUARDED_BY(mu_);
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// Create + Connect, as one backend.
absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    const BackendOptions& options, Store* store,
    const NcclOptions& nccl_options);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_NCCL_BACKEND_H_
