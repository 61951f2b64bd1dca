// What a coordinator replica serves on its address while it stands by
// (--etcd, another replica leads): every call, of any method, is answered
// at once with UNAVAILABLE naming the leader, in the message and in the
// trailing metadata kLeaderMetadataKey (common/host_ports.h), so that a
// client that reached a standby moves to the leader instead of waiting on
// it. It knows no service and holds no state.
#ifndef GRADSYNC_SERVER_STANDBY_SERVER_H_
#define GRADSYNC_SERVER_STANDBY_SERVER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

// Thread-safe. Serves from Start() until destruction, which stops it and
// frees the address (for the coordinator that serves there once this
// replica leads).
class StandbyServer {
 public:
  // Listens on `listen_address` (HOST:PORT) with `credentials` (nullptr:
  // plaintext), as the coordinator will. UNAVAILABLE when it cannot.
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      const std::string& listen_address,
      std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);
  ~StandbyServer();
  StandbyServer(const StandbyServer&) = delete;
  StandbyServer& operator=(const StandbyServer&) = delete;

  // The leader's address from now on; empty while none is known.
  void SetLeader(const std::string& address);

  int port() const { return port_; }

 private:
  StandbyServer() = default;
  // Answers calls until the server shuts down.
  void Serve();
  // Asks for the next call; false once the queue is shut down.
  bool RequestCall(void* tag);

  grpc::AsyncGenericService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::thread thread_;

  absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  // Set before the queue shuts down: no operation may start on it after.
  bool queue_closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STANDBY_SERVER_H_
