// TLS material read from PEM files, as the coordinator's and the clients'
// --tls_* flags name them; the gRPC credentials are built by each side
// (server/server_credentials.h, common/channel_credentials.h).
#ifndef GRADSYNC_COMMON_TLS_FILES_H_
#define GRADSYNC_COMMON_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

// The whole of the PEM file at `path`, for the flag `flag` (named in
// errors). NOT_FOUND when it cannot be read; INVALID_ARGUMENT when it holds
// no PEM block ("-----BEGIN").
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const std::string& flag);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TLS_FILES_H_
