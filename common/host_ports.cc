#include "common/host_ports.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace gradsync {
namespace {

bool IsIpv4(absl::string_view host) {
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4) return false;
  for (absl::string_view part : parts) {
    int byte = 0;
    if (part.empty() || part.size() > 3 || !absl::SimpleAtoi(part, &byte) ||
        byte < 0 || byte > 255) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseHostPorts(
    absl::string_view list, absl::string_view what, absl::string_view example) {
  std::vector<std::string> addresses;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    const size_t colon = entry.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(entry.substr(colon + 1), &port) || port < 1 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", entry, "' is not HOST:PORT (e.g. ", example, ")"));
    }
    addresses.emplace_back(entry);
  }
  return addresses;
}

absl::StatusOr<std::string> FailoverTarget(
    const std::vector<std::string>& addresses, absl::string_view what) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no ", what, " given"));
  }
  const std::string& first = addresses.front();
  if (addresses.size() == 1 &&
      !IsIpv4(absl::string_view(first).substr(0, first.rfind(':')))) {
    return first;  // a name, for the DNS resolver
  }
  for (const std::string& address : addresses) {
    if (!IsIpv4(absl::string_view(address).substr(0, address.rfind(':')))) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", address,
          "': give several as IPv4 addresses (HOST:PORT with a numeric HOST), "
          "or one by name"));
    }
  }
  return absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
}

}  // namespace gradsync
