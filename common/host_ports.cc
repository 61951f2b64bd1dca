#include "common/host_ports.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

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

// `address` (HOST:PORT) as IPv4 HOST:PORT entries: itself for an IPv4
// HOST, otherwise every IPv4 address the name resolves to now.
absl::StatusOr<std::vector<std::string>> ResolveIpv4(
    const std::string& address, absl::string_view what) {
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (IsIpv4(host)) return std::vector<std::string>{address};
  if (host.find_first_not_of("0123456789.") == std::string::npos) {
    // getaddrinfo would read "10.1" as 10.0.0.1.
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", address, "': '", host, "' is not an IPv4 address"));
  }
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat(
        what, " '", address, "': cannot resolve '", host,
        "' to an IPv4 address: ", gai_strerror(error)));
  }
  std::vector<std::string> resolved;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) {
      continue;
    }
    std::string entry = absl::StrCat(text, ":", port);
    if (std::find(resolved.begin(), resolved.end(), entry) == resolved.end()) {
      resolved.push_back(std::move(entry));
    }
  }
  freeaddrinfo(found);
  return resolved;
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
  std::vector<std::string> ipv4;
  for (const std::string& address : addresses) {
    absl::StatusOr<std::vector<std::string>> resolved =
        ResolveIpv4(address, what);
    if (!resolved.ok()) return resolved.status();
    for (std::string& entry : *resolved) {
      if (std::find(ipv4.begin(), ipv4.end(), entry) == ipv4.end()) {
        ipv4.push_back(std::move(entry));
      }
    }
  }
  if (ipv4.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no IPv4 address for any ", what, " given"));
  }
  return absl::StrCat("ipv4:", absl::StrJoin(ipv4, ","));
}

}  // namespace gradsync
