#include "common/tls_files.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' is not a PEM file"));
  }
  return text.str();
}

}  // namespace gradsync
