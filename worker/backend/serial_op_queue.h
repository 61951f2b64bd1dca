// The part of a CPU backend that is the same whatever moves the bytes: one
// background thread runs the collectives one at a time, in issue order,
// numbers them 1, 2, ..., completes each one's Work, and once one has failed
// refuses the rest. GlooBackend and ShmBackend are built on it.
#ifndef GRADSYNC_WORKER_BACKEND_SERIAL_OP_QUEUE_H_
#define GRADSYNC_WORKER_BACKEND_SERIAL_OP_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/work.h"

namespace gradsync {

// Thread-safe: Enqueue may be called from any thread; collectives enqueued
// concurrently run in the order their calls took the queue's lock. The owner
// calls Shutdown() (at the latest) before destroying what the queued
// functions use.
class SerialOpQueue {
 public:
  // Runs one collective on the queue's thread. `sequence` is its number and
  // `where` the prefix of its messages, Describe(collective, sequence).
  using RunFn =
      std::function<absl::Status(uint64_t sequence, const std::string& where)>;

  // `backend` names the backend in messages ("gloo"); `rank` and
  // `world_size` are the owner's. `on_thread_start`, unless empty, runs first
  // on the background thread (e.g. to set its signal mask). Starts the thread.
  SerialOpQueue(std::string backend, int rank, int world_size,
                std::function<void()> on_thread_start = nullptr);
  // Shutdown().
  ~SerialOpQueue();
  SerialOpQueue(const SerialOpQueue&) = delete;
  SerialOpQueue& operator=(const SerialOpQueue&) = delete;

  // Numbers a collective whose arguments the caller has checked and queues
  // it. Its Work completes, after every collective enqueued before it, with:
  //  - what `run` returns; OK when `run` is empty (a collective of no
  //    elements, which still waits its turn);
  //  - ABORTED, without running, once an earlier collective returned an
  //    error ("...: not run: an earlier collective failed (...); create a
  //    new backend in a new round");
  //  - CANCELLED, without running, when Shutdown() came first.
  std::shared_ptr<Work> Enqueue(const char* collective, RunFn run);

  // Fails the collectives that have not started with CANCELLED; then runs
  // `interrupt` unless it is empty (it should make the collective running,
  // if any, end soon), waits for that collective and stops the thread.
  // Idempotent.
  void Shutdown(const std::function<void()>& interrupt = nullptr);

  // "gloo allreduce #17 (rank 2 of 4)", the prefix of every message.
  std::string Describe(const char* collective, uint64_t sequence) const;

 private:
  struct Op {
    uint64_t sequence = 0;
    std::shared_ptr<Work> work;
    const char* collective = "";
    RunFn run;
  };

  // The background thread: pops and runs ops until stopping_.
  void Loop(const std::function<void()>& on_thread_start);
  bool HasOpOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }
  // Runs one op; records its failure in broken_.
  absl::Status Run(Op& op);
  // Finishes `op` with CANCELLED.
  void Cancel(Op& op) const;

  const std::string backend_;
  const int rank_;
  const int world_size_;

  absl::Mutex mu_;
  uint64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  // Set by Shutdown(); the thread exits once it sees it.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // The first failure (OK until then). Only the background thread uses it.
  absl::Status broken_;

  // Declared last: started once every other member is ready.
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_SERIAL_OP_QUEUE_H_
