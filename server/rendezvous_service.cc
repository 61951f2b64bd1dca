#include "server/rendezvous_service.h"

#include <utility>
#include <vector>

#include "common/grpc_status.h"

namespace gradsync {

RendezvousService::RendezvousService(RendezvousManager* rendezvous,
                                     const Authenticator* auth)
    : rendezvous_(rendezvous),
      auth_(auth),
      join_{"/gradsync.v1.Rendezvous/Join",
            [this](auto... args) { RequestJoin(args...); },
            [this](JoinCall* call) { ServeJoin(call); }},
      join_node_{"/gradsync.v1.Rendezvous/JoinNode",
                 [this](auto... args) { RequestJoinNode(args...); },
                 [this](JoinNodeCall* call) { ServeJoinNode(call); }} {}

void RendezvousService::Start(const CompletionQueues& queues) {
  JoinCall::Serve(queues, &join_);
  JoinNodeCall::Serve(queues, &join_node_);
}

void RendezvousService::ServeJoin(JoinCall* call) {
  absl::Status allowed = auth_->Check(call->context(), call->request().job_id());
  if (!allowed.ok()) {
    call->Finish({}, ToGrpcStatus(allowed));
    return;
  }
  uint64_t ticket = rendezvous_->Join(
      call->request(), [call](absl::StatusOr<v1::Assignment> assignment) {
        v1::JoinResponse response;
        if (assignment.ok()) {
          *response.mutable_assignment() = *std::move(assignment);
        }
        call->Finish(response, ToGrpcStatus(assignment.status()));
      });
  if (ticket != 0) {
    call->SetCancelHandler(
        [rendezvous = rendezvous_, ticket] { rendezvous->CancelJoin(ticket); });
  }
}

void RendezvousService::ServeJoinNode(JoinNodeCall* call) {
  absl::Status allowed = auth_->Check(call->context(), call->request().job_id());
  if (!allowed.ok()) {
    call->Finish({}, ToGrpcStatus(allowed));
    return;
  }
  std::vector<uint64_t> tickets = rendezvous_->JoinNode(
      call->request(),
      [call](absl::StatusOr<std::vector<v1::Assignment>> assignments) {
        v1::JoinNodeResponse response;
        if (assignments.ok()) {
          for (v1::Assignment& a : *assignments) {
            *response.add_assignments() = std::move(a);
          }
        }
        call->Finish(response, ToGrpcStatus(assignments.status()));
      });
  if (!tickets.empty()) {
    call->SetCancelHandler([rendezvous = rendezvous_, tickets] {
      for (uint64_t ticket : tickets) rendezvous->CancelJoin(ticket);
    });
  }
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
