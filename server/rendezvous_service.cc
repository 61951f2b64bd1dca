#include "server/rendezvous_service.h"

#include "common/grpc_status.h"
#include "server/cancellable_reactor.h"

namespace gradsync {

grpc::ServerUnaryReactor* RendezvousService::Join(
    grpc::CallbackServerContext* context, const v1::JoinRequest* request,
    v1::JoinResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->job_id())) {
    return refused;
  }
  auto* reactor = new CancellableReactor();
  uint64_t ticket = rendezvous_->Join(
      *request,
      [reactor, response](absl::StatusOr<v1::Assignment> assignment) {
        if (assignment.ok()) {
          *response->mutable_assignment() = *std::move(assignment);
        }
        reactor->Finish(ToGrpcStatus(assignment.status()));
      });
  if (ticket != 0) {
    reactor->SetCancelHandler(
        [rendezvous = rendezvous_, ticket] { rendezvous->CancelJoin(ticket); });
  }
  reactor->Release();
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Leave(
    grpc::CallbackServerContext* context, const v1::LeaveRequest* request,
    v1::LeaveResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->job_id())) {
    return refused;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(
      rendezvous_->Leave(request->job_id(), request->incarnation_id())));
  return reactor;
}

}  // namespace gradsync
