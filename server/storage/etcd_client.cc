#include "server/storage/etcd_client.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/host_ports.h"
#include "common/status_macros.h"

namespace gradsync {
absl::StatusOr<EtcdConnection> EtcdConnection::Create(
    const std::vector<std::string>& endpoints, absl::Duration call_timeout,
    const ClientTls& tls) {
  GS_ASSIGN_OR_RETURN(std::string target,
                      FailoverTarget(endpoints, "etcd endpoint"));
  GS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      MakeChannelCredentials(tls, "--etcd_tls"));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return EtcdConnection(grpc::CreateCustomChannel(target, credentials, args),
                        absl::StrJoin(endpoints, ","), call_timeout);
}

std::unique_ptr<grpc::ClientContext> EtcdConnection::Context(
    absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(
                            timeout > absl::ZeroDuration() ? timeout
                                                           : call_timeout_));
  context->set_wait_for_ready(true);
  return context;
}

absl::Status EtcdConnection::Failed(absl::string_view what,
                                    const grpc::Status& status) const {
  const absl::Status s = FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat("etcd at ", endpoints_, ": ",
                                             what, ": ", s.message()));
}

}  // namespace gradsync
