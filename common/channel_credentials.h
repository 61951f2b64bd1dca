// A gRPC client's transport security, from its --tls_* flags (a worker's
// toward the coordinator, the coordinator's toward etcd): plaintext, TLS
// (the server's certificate checked against a CA), or mutual TLS (this
// client's certificate too).
#ifndef GRADSYNC_COMMON_CHANNEL_CREDENTIALS_H_
#define GRADSYNC_COMMON_CHANNEL_CREDENTIALS_H_

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

struct ClientTls {
  std::string ca;    // PEM CA that signed the server's certificate
  std::string cert;  // this client's PEM certificate (mutual TLS)
  std::string key;   // its PEM private key
};

// Insecure credentials when `tls.ca` is empty. INVALID_ARGUMENT for a
// client certificate without a CA, or a certificate without its key (or
// the reverse); ReadPemFile's errors. Errors name the flags as
// `flags`_ca, `flags`_cert and `flags`_key.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTls& tls,
                       const std::string& flags = "--tls");

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_CHANNEL_CREDENTIALS_H_
