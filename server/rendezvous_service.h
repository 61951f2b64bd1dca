#ifndef GRADSYNC_SERVER_RENDEZVOUS_SERVICE_H_
#define GRADSYNC_SERVER_RENDEZVOUS_SERVICE_H_

#include "proto/gradsync/v1/rendezvous.grpc.pb.h"
#include "server/authenticator.h"
#include "server/rendezvous_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Rendezvous; all logic is in
// RendezvousManager. Joins wait without holding a thread. Thread-safe;
// `rendezvous` must outlive it.
class RendezvousService final : public v1::Rendezvous::CallbackService {
 public:
  // `auth` decides who may call about which job.
  RendezvousService(RendezvousManager* rendezvous, const Authenticator* auth)
      : rendezvous_(rendezvous), auth_(auth) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;

 private:
  RendezvousManager* const rendezvous_;
  const Authenticator* const auth_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_RENDEZVOUS_SERVICE_H_
