#ifndef GRADSYNC_SERVER_KV_SERVICE_H_
#define GRADSYNC_SERVER_KV_SERVICE_H_

#include "proto/gradsync/v1/kv.grpc.pb.h"
#include "server/authenticator.h"
#include "server/kv_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.KeyValue; all logic is in KvManager. Waits
// hold no thread. Thread-safe; `kv` must outlive it.
class KvService final : public v1::KeyValue::CallbackService {
 public:
  // `auth` decides who may call about which job.
  KvService(KvManager* kv, const Authenticator* auth) : kv_(kv), auth_(auth) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const v1::AddRequest* request,
                                v1::AddResponse* response) override;
  grpc::ServerUnaryReactor* CompareAndSet(
      grpc::CallbackServerContext* context,
      const v1::CompareAndSetRequest* request,
      v1::CompareAndSetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const v1::DeleteRequest* request,
                                   v1::DeleteResponse* response) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* context,
                                 const v1::ListRequest* request,
                                 v1::ListResponse* response) override;

 private:
  KvManager* const kv_;
  const Authenticator* const auth_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_KV_SERVICE_H_
