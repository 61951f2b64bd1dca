// The torch process group "gradsync": torch.distributed's collectives over a
// gradsync Backend (the shared-memory backend when every rank is on one
// host, Gloo otherwise), so that a PyTorch script, DDP included, runs its
// collectives on them (python/gradsync/torch.py registers it with
// torch.distributed.Backend.register_backend; the extension module
// python/ext/module.cc makes one). Tensors must be dense and contiguous, on
// the CPU or, when the backend is NCCL on a GPU (gradsync.elastic rounds with
// device "cuda"), on that GPU; allreduce takes SUM and AVG.
//
// CUDA tensors: a collective runs after the work queued on the tensor's
// current stream when it was called; its future is a CUDA future (a
// consumer's wait orders the consumer's stream after it), completed once the
// collective is known to have ended without error. Work::wait() blocks the
// host until then, so that a loop that waits before optimizer.step() never
// applies a step whose all-reduce an abort or an asynchronous NCCL error
// cut short.
#ifndef GRADSYNC_WORKER_TORCH_PROCESS_GROUP_H_
#define GRADSYNC_WORKER_TORCH_PROCESS_GROUP_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/backend/store.h"

namespace gradsync {

// Runs `wait`, the calling thread's wait for a group's completing thread,
// which runs the futures' callbacks: a Python callback there needs the GIL,
// which a thread dropping the group from Python holds (the Python
// extension's releases it around `wait` then).
using BlockingWait = std::function<void(const std::function<void()>& wait)>;

// Collectives run in issue order on the backend; each returns a c10d::Work
// whose future (getFuture, which DDP's communication hooks chain on) a
// thread of this group completes once the collective ended. Errors are
// exceptions that name the collective and the backend's status. Thread-safe
// as torch process groups are (one issuing thread at a time per group is
// what torch does). The destructor ends the group (End) and destroys a
// backend it owns.
class TorchProcessGroup final : public c10d::ProcessGroup {
 public:
  // Owns `backend`. `blocking_wait` (nullptr: none) runs End()'s wait for
  // the completing thread.
  explicit TorchProcessGroup(std::unique_ptr<Backend> backend,
                             BlockingWait blocking_wait = nullptr);
  // Over `backend`, which must stay alive until End() returned: a round's
  // backend that the runtime owns (python/ext/job.cc).
  explicit TorchProcessGroup(Backend* backend);
  ~TorchProcessGroup() override;

  const std::string getBackendName() const override { return "gradsync"; }
  // The backend underneath: "shm", "gloo" or "nccl"; also once the group
  // ended.
  const std::string& transport() const { return transport_; }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // Fails the collective in flight and every later one promptly, here and
  // at the peers in a collective with this rank (Backend::Abort): for a
  // thread that learns the round is over while training is blocked in one.
  // Nothing once the group ended (End): its collectives have ended, and a
  // backend it does not own may be gone.
  void Abort();

  // Ends the group's use of its backend: aborts it when collectives are
  // still pending (so that they end), waits for them, and stops the
  // completing thread; every later collective throws ("the round of this
  // process group is over"). Idempotent; the caller's thread must not be
  // issuing collectives at the same time.
  void End();

  // The status of the first collective that failed (OK while none has):
  // what ended a round (UNAVAILABLE: a peer left; ABORTED: aborted).
  absl::Status first_failure() const;

 private:
  struct Pending;

  // Queues `work` for the completing thread: its future completes with
  // `outputs` once it succeeded and `finish` (e.g. copying a gathered
  // buffer out) ran; `keep` stays alive until then. Throws when the backend
  // refused the arguments (INVALID_ARGUMENT: nothing was issued).
  c10::intrusive_ptr<c10d::Work> Track(const char* collective,
                                       c10d::OpType type,
                                       std::shared_ptr<Work> work,
                                       std::vector<at::Tensor> outputs,
                                       std::vector<at::Tensor> keep,
                                       std::function<void()> finish = nullptr);
  void CompleteLoop();
  // Throws when End() was called.
  void CheckLive(const char* collective) const;

  const std::unique_ptr<Backend> owned_;
  Backend* const backend_;
  const BlockingWait blocking_wait_;
  const std::string transport_;  // backend_->name()
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  // Whether the completing thread is waiting for one it took off pending_.
  bool completing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_failure_ ABSL_GUARDED_BY(mu_);
  std::thread completer_;
};

// How CreateTorchProcessGroup builds a group.
struct TorchGroupOptions {
  // A collective that has not completed after this long fails.
  absl::Duration timeout = absl::Minutes(30);
  // When every rank runs on this host (their hostnames, exchanged through
  // the store, all equal): the shared-memory backend; false: Gloo always.
  // Every rank must pass the same value.
  bool shared_memory = true;
  // The address Gloo binds and advertises; empty: the address this host's
  // name resolves to.
  std::string gloo_address;
  // The group's BlockingWait (nullptr: none).
  BlockingWait blocking_wait;
};

// Makes the group for `rank` of `world_size`, bootstrapped through `store`
// (each rank calls it; it blocks until all have). The backends' errors
// (INVALID_ARGUMENT for a bad rank or size, DEADLINE_EXCEEDED when a rank
// never comes within the timeout).
absl::StatusOr<c10::intrusive_ptr<TorchProcessGroup>> CreateTorchProcessGroup(
    Store* store, int rank, int world_size, const TorchGroupOptions& options);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TORCH_PROCESS_GROUP_H_
