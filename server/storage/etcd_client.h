// What every client of etcd in the coordinator shares: the endpoints, the
// gRPC channel to them, and how calls are bounded and their errors named.
#ifndef GRADSYNC_SERVER_STORAGE_ETCD_CLIENT_H_
#define GRADSYNC_SERVER_STORAGE_ETCD_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/channel_credentials.h"

namespace gradsync {

// A connection to an etcd cluster. Thread-safe; the channel reconnects on
// its own and fails over between several endpoints.
class EtcdConnection {
 public:
  // Over TLS when `tls.ca` is set (mutual TLS with `tls.cert`: etcd's
  // --client-cert-auth). INVALID_ARGUMENT for no endpoint;
  // FailoverTarget's errors (a name in a list that does not resolve);
  // MakeChannelCredentials' (naming the --etcd_tls_* flags).
  static absl::StatusOr<EtcdConnection> Create(
      const std::vector<std::string>& endpoints, absl::Duration call_timeout,
      const ClientTls& tls = ClientTls());

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // A context whose deadline is `timeout` away (the call timeout when
  // zero), waiting for the channel within it rather than failing at once
  // while a member restarts.
  std::unique_ptr<grpc::ClientContext> Context(
      absl::Duration timeout = absl::ZeroDuration()) const;
  // `status` of a finished call as an absl::Status naming `what` and the
  // endpoints.
  absl::Status Failed(absl::string_view what, const grpc::Status& status) const;
  const std::string& endpoints() const { return endpoints_; }

 private:
  EtcdConnection(std::shared_ptr<grpc::Channel> channel, std::string endpoints,
                 absl::Duration call_timeout)
      : channel_(std::move(channel)),
        endpoints_(std::move(endpoints)),
        call_timeout_(call_timeout) {}

  std::shared_ptr<grpc::Channel> channel_;
  std::string endpoints_;  // "a:1,b:2", for errors
  absl::Duration call_timeout_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STORAGE_ETCD_CLIENT_H_
