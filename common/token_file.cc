#include "common/token_file.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path,
                                          const std::string& flag) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(flag, ": cannot read the token file '", path, "'"));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the token file '", path, "' is empty"));
  }
  for (char c : token) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": the token file '", path, "' holds more than one word"));
    }
  }
  return token;
}

absl::StatusOr<std::string> ClientToken(const std::string& token_file) {
  if (!token_file.empty()) return ReadTokenFile(token_file, "--token_file");
  const char* token = std::getenv("GRADSYNC_TOKEN");
  return token != nullptr ? std::string(token) : std::string();
}

}  // namespace gradsync
