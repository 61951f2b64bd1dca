// Bearer tokens (the coordinator's --auth=token) read from files or the
// environment, for the coordinator's admin token and the clients' tokens.
#ifndef GRADSYNC_COMMON_TOKEN_FILE_H_
#define GRADSYNC_COMMON_TOKEN_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

// The token in the file at `path` (surrounding whitespace dropped), for the
// flag `flag` (named in errors, the token never). NOT_FOUND when it cannot
// be read; INVALID_ARGUMENT when it is empty or holds whitespace inside.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path,
                                          const std::string& flag);

// A client's token: from `token_file` (--token_file) when given, else from
// $GRADSYNC_TOKEN, else "" (no token). Errors as ReadTokenFile's.
absl::StatusOr<std::string> ClientToken(const std::string& token_file);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TOKEN_FILE_H_
