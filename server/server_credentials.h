// The coordinator's transport security, from its --tls_* flags: plaintext,
// TLS, or mutual TLS (clients must present a certificate signed by the
// given CA).
#ifndef GRADSYNC_SERVER_SERVER_CREDENTIALS_H_
#define GRADSYNC_SERVER_SERVER_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

struct ServerTls {
  std::string cert;       // PEM certificate chain; empty: plaintext
  std::string key;        // its PEM private key
  std::string client_ca;  // PEM CA; set: clients need a certificate it signed
};

// Insecure credentials when `tls.cert` is empty. INVALID_ARGUMENT for a
// key or client CA without a certificate, or a certificate without a key;
// ReadPemFile's errors.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_SERVER_CREDENTIALS_H_
