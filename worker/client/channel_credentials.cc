#include "worker/client/channel_credentials.h"

#include "common/status_macros.h"
#include "common/tls_files.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTls& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together");
  }
  if (tls.ca.empty()) {
    if (!tls.cert.empty()) {
      return absl::InvalidArgumentError("--tls_cert needs --tls_ca");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  GS_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile(tls.ca, "--tls_ca"));
  if (!tls.cert.empty()) {
    GS_ASSIGN_OR_RETURN(options.pem_cert_chain,
                        ReadPemFile(tls.cert, "--tls_cert"));
    GS_ASSIGN_OR_RETURN(options.pem_private_key,
                        ReadPemFile(tls.key, "--tls_key"));
  }
  return grpc::SslCredentials(options);
}

}  // namespace gradsync
