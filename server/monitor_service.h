#ifndef GRADSYNC_SERVER_MONITOR_SERVICE_H_
#define GRADSYNC_SERVER_MONITOR_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "proto/gradsync/v1/health.grpc.pb.h"
#include "server/authenticator.h"
#include "server/completion_queues.h"
#include "server/connection_limits.h"
#include "server/health_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Monitor; all logic is in HealthManager.
//
// Heartbeat streams (one member's, or a node's members' together) use the
// asynchronous API on the coordinator's CompletionQueues (see there why);
// ReportCompletion uses the callback API.
//
// Lifetime: construct; Start() once the server is built (it requests the
// first streams on every queue) and before the queues start; the queues'
// Shutdown() ends every stream. `health`, `auth`, `limits` and `queues`
// must outlive it. Thread-safe.
class MonitorService final
    : public v1::Monitor::WithAsyncMethod_Heartbeat<
          v1::Monitor::WithAsyncMethod_NodeHeartbeat<
              v1::Monitor::WithCallbackMethod_ReportCompletion<
                  v1::Monitor::Service>>> {
 public:
  // `auth` decides who may report for which job; `limits` bounds the
  // heartbeat streams of a connection.
  MonitorService(HealthManager* health, const Authenticator* auth,
                 ConnectionLimits* limits)
      : health_(health), auth_(auth), limits_(limits) {}
  // Starts accepting heartbeat streams (both kinds) on every queue of
  // `queues`.
  void Start(CompletionQueues* queues);

  grpc::ServerUnaryReactor* ReportCompletion(
      grpc::CallbackServerContext* context,
      const v1::ReportCompletionRequest* request,
      v1::ReportCompletionResponse* response) override;

 private:
  template <typename Protocol>
  class StreamCall;

  HealthManager* const health_;
  const Authenticator* const auth_;
  ConnectionLimits* const limits_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_MONITOR_SERVICE_H_
