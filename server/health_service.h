#ifndef GRADSYNC_SERVER_HEALTH_SERVICE_H_
#define GRADSYNC_SERVER_HEALTH_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/health.grpc.pb.h"
#include "server/authenticator.h"
#include "server/completion_batcher.h"
#include "server/completion_queues.h"
#include "server/connection_limits.h"
#include "server/health_manager.h"
#include "server/heartbeat_pacer.h"
#include "server/heartbeat_policer.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Monitor (the wire keeps that name until a
// v2; gradsync calls the concept health: HealthManager here, HealthReporter
// on the workers); all logic is in HealthManager.
//
// Heartbeat streams (one member's, or a node's members' together) use the
// asynchronous API on the coordinator's CompletionQueues (see there why);
// each holds back the messages its worker sends faster than the coordinator
// asked (HeartbeatPolicer: a job that ignores its interval cannot keep the
// coordinator behind and so slow failure detection in the others);
// ReportCompletion uses the callback API, answered from a CompletionBatcher
// (completions recorded in batches, off gRPC's threads).
//
// Lifetime: construct; Start() once the server is built (it requests the
// first streams on every queue) and before the queues start; the queues'
// Shutdown() ends every stream. `health`, `auth`, `limits` and `queues`
// must outlive it. Thread-safe.
class HealthService final
    : public v1::Monitor::WithRawMethod_Heartbeat<
          v1::Monitor::WithRawMethod_NodeHeartbeat<
              v1::Monitor::WithCallbackMethod_ReportCompletion<
                  v1::Monitor::Service>>> {
 public:
  // `auth` decides who may report for which job; `limits` bounds the
  // heartbeat streams of a connection. `max_heartbeat_rate` > 0 caps the
  // heartbeats handled per second, shared fairly across jobs
  // (HeartbeatPacer); 0: no cap. `police`: hold back what streams send
  // faster than asked.
  HealthService(HealthManager* health, const Authenticator* auth,
                ConnectionLimits* limits, double max_heartbeat_rate = 0,
                bool police = true);
  ~HealthService();
  // Starts accepting heartbeat streams (both kinds) on every queue of
  // `queues`.
  void Start(CompletionQueues* queues);

  // Under a rate cap, how long each job's heartbeats read last still wait
  // for their turns at `now` (HeartbeatPacer::WaitsAt); none without one.
  HeartbeatPacer::Waits TurnWaits(absl::Time now) const;

  grpc::ServerUnaryReactor* ReportCompletion(
      grpc::CallbackServerContext* context,
      const v1::ReportCompletionRequest* request,
      v1::ReportCompletionResponse* response) override;

 private:
  template <typename Protocol>
  class StreamCall;

  // Logs, at most once a minute, that heartbeat streams send faster than
  // asked and are held back: `who` (the latest such stream's members) was
  // asked for `asked`.
  void NoteHeld(const std::string& who, const HeartbeatPolicer::Asked& asked);

  HealthManager* const health_;
  const Authenticator* const auth_;
  ConnectionLimits* const limits_;
  // Null without a cap.
  const std::unique_ptr<HeartbeatPacer> pacer_;
  const bool police_;
  absl::Mutex held_mu_;
  absl::Time held_logged_ ABSL_GUARDED_BY(held_mu_) = absl::InfinitePast();
  // Streams first held back since the last such log line.
  int64_t held_streams_ ABSL_GUARDED_BY(held_mu_) = 0;
  // Last: its thread records completions until the service goes, after
  // the server that called ReportCompletion shut down.
  CompletionBatcher completions_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HEALTH_SERVICE_H_
