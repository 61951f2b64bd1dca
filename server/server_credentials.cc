#include "server/server_credentials.h"

#include <grpcpp/security/server_credentials.h>

#include "common/status_macros.h"
#include "common/tls_files.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls) {
  if (tls.cert.empty()) {
    if (!tls.key.empty() || !tls.client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_key and --tls_client_ca need --tls_cert");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert needs --tls_key");
  }
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  GS_ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile(tls.cert, "--tls_cert"));
  GS_ASSIGN_OR_RETURN(pair.private_key, ReadPemFile(tls.key, "--tls_key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca.empty()) {
    GS_ASSIGN_OR_RETURN(options.pem_root_certs,
                        ReadPemFile(tls.client_ca, "--tls_client_ca"));
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace gradsync
