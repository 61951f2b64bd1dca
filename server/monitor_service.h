#ifndef GRADSYNC_SERVER_MONITOR_SERVICE_H_
#define GRADSYNC_SERVER_MONITOR_SERVICE_H_

#include "proto/gradsync/v1/health.grpc.pb.h"
#include "server/health_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Monitor; all logic is in HealthManager. A
// heartbeat stream holds no thread between messages. Thread-safe; `health`
// must outlive it.
class MonitorService final : public v1::Monitor::CallbackService {
 public:
  explicit MonitorService(HealthManager* health) : health_(health) {}

  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>*
  Heartbeat(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ReportCompletion(
      grpc::CallbackServerContext* context,
      const v1::ReportCompletionRequest* request,
      v1::ReportCompletionResponse* response) override;

 private:
  HealthManager* const health_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_MONITOR_SERVICE_H_
