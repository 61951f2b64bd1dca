// A client's transport security toward the coordinator, from its --tls_*
// flags: plaintext, TLS (the coordinator's certificate checked against a
// CA), or mutual TLS (this client's certificate too).
#ifndef GRADSYNC_WORKER_CLIENT_CHANNEL_CREDENTIALS_H_
#define GRADSYNC_WORKER_CLIENT_CHANNEL_CREDENTIALS_H_

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

struct ClientTls {
  std::string ca;    // PEM CA that signed the coordinator's certificate
  std::string cert;  // this client's PEM certificate (mutual TLS)
  std::string key;   // its PEM private key
};

// Insecure credentials when `tls.ca` is empty. INVALID_ARGUMENT for a
// client certificate without a CA, or a certificate without its key (or
// the reverse); ReadPemFile's errors.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTls& tls);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_CLIENT_CHANNEL_CREDENTIALS_H_
