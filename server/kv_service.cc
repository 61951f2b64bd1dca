#include "server/kv_service.h"

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/leader_term.h"
#include "server/cancellable_reactor.h"

namespace gradsync {
namespace {

KvScope ToScope(const v1::Scope& scope) {
  return KvScope{scope.job_id(), scope.round()};
}

}  // namespace

void KvService::Finish(grpc::CallbackServerContext* context,
                       grpc::ServerUnaryReactor* reactor,
                       const absl::Status& status) const {
  if (leader_term_ > 0) {
    context->AddTrailingMetadata(
        kTermMetadataKey, FormatTermStamp({leader_term_, absl::Now()}));
  }
  reactor->Finish(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* KvService::Done(grpc::CallbackServerContext* context,
                                          const absl::Status& status) const {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Finish(context, reactor, status);
  return reactor;
}

grpc::ServerUnaryReactor* KvService::Set(grpc::CallbackServerContext* context,
                                         const v1::SetRequest* request,
                                         v1::SetResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->scope().job_id())) {
    return refused;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  kv_->SetAsync(ToScope(request->scope()), request->key(), request->value(),
                [this, context, reactor](absl::Status status) {
                  Finish(context, reactor, status);
                });
  return reactor;
}

grpc::ServerUnaryReactor* KvService::Get(grpc::CallbackServerContext* context,
                                         const v1::GetRequest* request,
                                         v1::GetResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->scope().job_id())) {
    return refused;
  }
  absl::StatusOr<std::string> value =
      kv_->Get(ToScope(request->scope()), request->key());
  if (value.ok()) response->set_value(*std::move(value));
  return Done(context, value.status());
}

grpc::ServerUnaryReactor* KvService::Add(grpc::CallbackServerContext* context,
                                         const v1::AddRequest* request,
                                         v1::AddResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->scope().job_id())) {
    return refused;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  kv_->AddAsync(ToScope(request->scope()), request->key(), request->delta(),
                request->request_id(),
                [this, context, reactor, response](absl::StatusOr<int64_t> value) {
                  if (value.ok()) response->set_value(*value);
                  Finish(context, reactor, value.status());
                });
  return reactor;
}

grpc::ServerUnaryReactor* KvService::CompareAndSet(
    grpc::CallbackServerContext* context,
    const v1::CompareAndSetRequest* request,
    v1::CompareAndSetResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->scope().job_id())) {
    return refused;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  kv_->CompareAndSetAsync(
      ToScope(request->scope()), request->key(), request->expected(),
      request->expect_absent(), request->desired(), request->request_id(),
      [this, context, reactor, response](absl::StatusOr<CasResult> result) {
        if (result.ok()) {
          response->set_swapped(result->swapped);
          response->set_exists(result->exists);
          response->set_value(std::move(result->value));
        }
        Finish(context, reactor, result.status());
      });
  return reactor;
}

grpc::ServerUnaryReactor* KvService::Wait(grpc::CallbackServerContext* context,
                                          const v1::WaitRequest* request,
                                          v1::WaitResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->scope().job_id())) {
    return refused;
  }
  auto* reactor = new CancellableReactor();
  uint64_t ticket = kv_->Wait(
      ToScope(request->scope()),
      {request->keys().begin(), request->keys().end()},
      absl::Milliseconds(request->timeout_ms()),
      [reactor](absl::Status status) { reactor->Finish(ToGrpcStatus(status)); });
  if (ticket != 0) {
    reactor->SetCancelHandler([kv = kv_, ticket] { kv->CancelWait(ticket); });
  }
  reactor->Release();
  return reactor;
}

grpc::ServerUnaryReactor* KvService::Delete(
    grpc::CallbackServerContext* context, const v1::DeleteRequest* request,
    v1::DeleteResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->scope().job_id())) {
    return refused;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  kv_->DeleteAsync(ToScope(request->scope()), request->key(),
                   [this, context, reactor, response](absl::StatusOr<bool> existed) {
                     if (existed.ok()) response->set_existed(*existed);
                     Finish(context, reactor, existed.status());
                   });
  return reactor;
}

grpc::ServerUnaryReactor* KvService::List(grpc::CallbackServerContext* context,
                                          const v1::ListRequest* request,
                                          v1::ListResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->scope().job_id())) {
    return refused;
  }
  absl::StatusOr<std::vector<Storage::Entry>> entries = kv_->List(
      ToScope(request->scope()), request->prefix(), request->keys_only());
  if (entries.ok()) {
    for (auto& [key, value] : *entries) {
      v1::ListResponse::Entry* entry = response->add_entries();
      entry->set_key(std::move(key));
      entry->set_value(std::move(value));
    }
  }
  return Done(context, entries.status());
}

}  // namespace gradsync
