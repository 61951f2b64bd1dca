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
  // `auth` decides who may call about which job. `leader_term` > 0: this
  // replica leads in that term (etcd), sent with every answer with the
  // time it was sent (common/leader_term.h).
  KvService(KvManager* kv, const Authenticator* auth, int64_t leader_term = 0)
      : kv_(kv), auth_(auth), leader_term_(leader_term) {}

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
  // Finishes `reactor`'s call with `status`, its term stamped.
  void Finish(grpc::CallbackServerContext* context,
              grpc::ServerUnaryReactor* reactor,
              const absl::Status& status) const;
  // Finishes a call that completed inline.
  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                                 const absl::Status& status) const;

  KvManager* const kv_;
  const Authenticator* const auth_;
  const int64_t leader_term_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_KV_SERVICE_H_
