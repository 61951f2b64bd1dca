#include "common/channel_credentials.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tls_files.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTls& tls, const std::string& flags) {
  const std::string ca = flags + "_ca", cert = flags + "_cert", key = flags + "_key";
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert, " and ", key, " go together"));
  }
  if (tls.ca.empty()) {
    if (!tls.cert.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(cert, " needs ", ca));
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  GS_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile(tls.ca, ca));
  if (!tls.cert.empty()) {
    GS_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPemFile(tls.cert, cert));
    GS_ASSIGN_OR_RETURN(options.pem_private_key, ReadPemFile(tls.key, key));
  }
  return grpc::SslCredentials(options);
}

}  // namespace gradsync
