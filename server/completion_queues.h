// The coordinator's completion queues for calls served with gRPC's
// asynchronous API: heartbeat streams, and the unary calls that wait long
// (joins) and exist by the ten thousand at once.
#ifndef GRADSYNC_SERVER_COMPLETION_QUEUES_H_
#define GRADSYNC_SERVER_COMPLETION_QUEUES_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace gradsync {

// Several server completion queues, each drained by its own thread.
//
// Why not the callback API for these calls: Debian's gRPC is built with
// debug checks that scan a completion queue's outstanding operations on
// every completion, and the callback API puts every call of the process on
// one queue. A heartbeat stream always has a read outstanding and a join
// waits until its round closes, so with one queue each event costs time
// proportional to the number of workers (heartbeat ingest collapsed beyond
// ~10,000 streams; 50,000 joins took 12 times as long as 10,000).
// `count` queues divide that cost.
//
// Shutdown: gRPC aborts the process when an operation is started on a
// completion queue whose shutdown has completed, and events of cancelled
// calls keep arriving after the server's Shutdown() returned. So every
// operation of ours starts under its queue's lock, only while the queue is
// open (StartOp), and Shutdown() closes each queue under that lock; a call
// whose operation is refused simply waits for the events it already has
// outstanding. gRPC++ also starts one operation itself, outside our lock:
// handing back an accepted call (Next()) starts that call's completion
// batch. So each queue holds a keepalive alarm, due never, that keeps its
// shutdown from completing; Shutdown() posts a marker alarm (due now) on
// each closed queue and cancels the keepalives only after every queue's
// thread ran its marker, i.e. consumed every call accepted before it.
//
// Queue delay: each queue runs a probe, an alarm set kProbePeriod ahead
// that, once run on the queue's thread, sets the next; Delays() is how
// late each queue runs what is due now (the age of the oldest probe
// waiting, or the latest probe's lateness). Events wait in a queue only
// when its thread cannot keep up, so the delay is near zero until the
// coordinator is past its capacity, and then rises at once
// (HealthManager::ReportQueueDelay).
//
// Lifetime: construct; AddTo() the builder before BuildAndStart(); the
// services request their first calls on queues(); Start(); after the
// server's Shutdown(), Shutdown() (drains the queues, joins the threads).
// Thread-safe.
class CompletionQueues {
 public:
  // What gRPC hands back for one completed operation: every tag given to
  // an operation on these queues must be one. Run() is called on the
  // queue's thread with the queue's verdict on the operation.
  class Tag {
   public:
    virtual void Run(bool ok) = 0;

   protected:
    ~Tag() = default;
  };

  // A completion queue and whether operations may still start on it.
  class Queue {
   public:
    grpc::ServerCompletionQueue* cq() const { return cq_.get(); }
    // Its place in queues() (and in Delays()).
    int index() const { return index_; }
    // Runs `start` (which starts one operation on cq()) under the lock if
    // the queue is open; returns whether it ran.
    bool StartOp(absl::FunctionRef<void()> start) ABSL_LOCKS_EXCLUDED(mu_);

   private:
    friend class CompletionQueues;
    // The queue-delay probe (see the class comment).
    class Probe final : public Tag {
     public:
      explicit Probe(Queue* queue) : queue_(queue) {}
      // Sets the alarm kProbePeriod from now; false once the queue closed.
      bool Arm();
      void Run(bool ok) override;
      // How late the queue runs what was due by `now`.
      absl::Duration Delay(absl::Time now) const;
      // Cancels a pending alarm (it runs with ok = false).
      void Cancel() { alarm_.Cancel(); }

     private:
      Queue* const queue_;
      grpc::Alarm alarm_;
      // When the pending alarm is due (0: none), and the last one's
      // lateness, in nanoseconds (written on the queue's thread).
      std::atomic<int64_t> due_ns_{0};
      std::atomic<int64_t> late_ns_{0};
    };

    // An alarm whose run (ok or cancelled) notifies `ran`.
    class Signal final : public Tag {
     public:
      void Run(bool /*ok*/) override { ran.Notify(); }
      grpc::Alarm alarm;
      absl::Notification ran;
    };

    std::unique_ptr<grpc::ServerCompletionQueue> cq_;
    int index_ = 0;
    absl::Mutex mu_;
    bool open_ ABSL_GUARDED_BY(mu_) = true;
    Probe probe_{this};
    // Set at Start(), cancelled at the end of Shutdown() (class comment).
    Signal keepalive_;
    // Set by Shutdown() once the queue is closed (class comment).
    Signal marker_;
  };

  // How often each queue's probe runs.
  static constexpr absl::Duration kProbePeriod = absl::Milliseconds(100);

  CompletionQueues() = default;
  CompletionQueues(const CompletionQueues&) = delete;
  CompletionQueues& operator=(const CompletionQueues&) = delete;
  ~CompletionQueues() { Shutdown(); }

  // Adds `count` (>= 1) completion queues to `builder`.
  void AddTo(grpc::ServerBuilder* builder, int count);
  const std::vector<std::unique_ptr<Queue>>& queues() const { return queues_; }
  // Starts one thread per queue, running the events of its queue, and the
  // queues' probes.
  void Start();
  // How late each queue runs what is due now, in the order of queues()
  // (see the class comment); zeros before Start(), none after Shutdown().
  std::vector<absl::Duration> Delays(absl::Time now) const;
  // Closes the queues, lets each thread run what was queued up to now,
  // shuts the queues down, then drains them and joins their threads (see
  // the class comment). Call after the server's Shutdown(). Idempotent.
  void Shutdown();

 private:
  // Runs the events of `queue` until it is shut down and drained.
  static void Drain(Queue* queue);

  std::vector<std::unique_ptr<Queue>> queues_;
  // Held by Delays() (called from other threads while the server runs) and
  // by Shutdown() to clear queues_; setup needs no lock.
  mutable absl::Mutex clear_mu_;
  std::vector<std::thread> threads_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_COMPLETION_QUEUES_H_
