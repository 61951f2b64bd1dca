#ifndef GRADSYNC_SERVER_MONITOR_SERVICE_H_
#define GRADSYNC_SERVER_MONITOR_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/gradsync/v1/health.grpc.pb.h"
#include "server/authenticator.h"
#include "server/health_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Monitor; all logic is in HealthManager.
//
// Heartbeat streams use the asynchronous API over several completion queues,
// each drained by its own thread; ReportCompletion uses the callback API.
// Why not callback streams: Debian's gRPC is built with debug checks that
// scan a completion queue's outstanding operations on every completion, and
// the callback API puts every call of the process on one queue. A heartbeat
// stream always has a read outstanding, so with one queue each heartbeat
// costs time proportional to the number of workers (ingest collapsed beyond
// ~10,000 streams); `queues` queues divide that cost.
//
// Shutdown: gRPC aborts the process when an operation is started on a
// completion queue that is shut down, and events of cancelled streams keep
// arriving after the server's Shutdown() returned (each stream answers its
// failed read with a Finish). So every operation starts under its queue's
// lock, only while the queue is open, and Shutdown() closes each queue under
// that lock before shutting it down; a stream whose operation is refused
// simply waits for its done event and deletes itself.
//
// Lifetime: construct; AddCompletionQueues() on the builder before
// BuildAndStart(); Start() after it; after the server's Shutdown(),
// Shutdown() (drains the queues, joins the threads). `health` must outlive
// it. Thread-safe.
class MonitorService final
    : public v1::Monitor::WithAsyncMethod_Heartbeat<
          v1::Monitor::WithCallbackMethod_ReportCompletion<
              v1::Monitor::Service>> {
 public:
  // `auth` decides who may report for which job.
  MonitorService(HealthManager* health, const Authenticator* auth)
      : health_(health), auth_(auth) {}
  ~MonitorService() override;

  // Adds `queues` (>= 1) completion queues for heartbeat streams.
  void AddCompletionQueues(grpc::ServerBuilder* builder, int queues);
  // Starts accepting heartbeat streams, one thread per queue.
  void Start();
  // Shuts the queues down and joins their threads. Idempotent.
  void Shutdown();

  grpc::ServerUnaryReactor* ReportCompletion(
      grpc::CallbackServerContext* context,
      const v1::ReportCompletionRequest* request,
      v1::ReportCompletionResponse* response) override;

 private:
  class HeartbeatCall;

  // A completion queue and whether operations may still start on it.
  struct Queue {
    std::unique_ptr<grpc::ServerCompletionQueue> cq;
    absl::Mutex mu;
    bool open ABSL_GUARDED_BY(mu) = true;

    // Runs `start` (which starts one operation on `cq`) under the lock if
    // the queue is open; returns whether it ran.
    bool StartOp(const std::function<void()>& start) ABSL_LOCKS_EXCLUDED(mu);
    // Refuses further operations, then shuts `cq` down.
    void Close() ABSL_LOCKS_EXCLUDED(mu);
  };

  // Accepts a new stream on `queue` (one is always waiting per open queue).
  void Accept(Queue* queue);
  // Runs the events of `queue` until it is shut down and drained.
  static void Drain(Queue* queue);

  HealthManager* const health_;
  const Authenticator* const auth_;
  std::vector<std::unique_ptr<Queue>> queues_;
  std::vector<std::thread> threads_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_MONITOR_SERVICE_H_
