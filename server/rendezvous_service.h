#ifndef GRADSYNC_SERVER_RENDEZVOUS_SERVICE_H_
#define GRADSYNC_SERVER_RENDEZVOUS_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "proto/gradsync/v1/rendezvous.grpc.pb.h"
#include "server/authenticator.h"
#include "server/completion_queues.h"
#include "server/pending_call.h"
#include "server/rendezvous_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Rendezvous; all logic is in
// RendezvousManager. Joins wait for their round without holding a thread,
// served raw with the asynchronous API on the coordinator's
// CompletionQueues (they exist by the ten thousand at once: see
// CompletionQueues; PendingCall parses them); Leave uses the callback API.
//
// Lifetime: construct; Start() once the server is built and before the
// queues start; the queues' Shutdown() ends every waiting join (the server's
// Shutdown() cancels them). `rendezvous`, `auth` and the queues must outlive
// it. Thread-safe.
class RendezvousService final
    : public v1::Rendezvous::WithRawMethod_Join<
          v1::Rendezvous::WithRawMethod_JoinNode<
              v1::Rendezvous::WithCallbackMethod_Leave<
                  v1::Rendezvous::Service>>> {
 public:
  // `auth` decides who may call about which job.
  RendezvousService(RendezvousManager* rendezvous, const Authenticator* auth);

  // Starts accepting joins on every queue of `queues`.
  void Start(const CompletionQueues& queues);

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;

 private:
  using JoinCall = PendingCall<v1::JoinRequest, v1::JoinResponse>;
  using JoinNodeCall = PendingCall<v1::JoinNodeRequest, v1::JoinNodeResponse>;

  void ServeJoin(JoinCall* call);
  void ServeJoinNode(JoinNodeCall* call);

  RendezvousManager* const rendezvous_;
  const Authenticator* const auth_;
  const JoinCall::Method join_;
  const JoinNodeCall::Method join_node_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_RENDEZVOUS_SERVICE_H_
