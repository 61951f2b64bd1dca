// Lists of HOST:PORT addresses, as flags give them ("--coordinator=A,B",
// "--etcd=A,B,C"), and the gRPC target that fails over between them.
#ifndef GRADSYNC_COMMON_HOST_PORTS_H_
#define GRADSYNC_COMMON_HOST_PORTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// The trailing metadata key under which a coordinator replica that stands
// by names the leader's address (HOST:PORT) in its UNAVAILABLE answers; a
// client moves there (see CoordinatorClient).
inline constexpr char kLeaderMetadataKey[] = "gradsync-leader";

// Splits "HOST:PORT[,HOST:PORT...]". INVALID_ARGUMENT for an entry that is
// not HOST:PORT with a port in 1-65535, naming `what` ("coordinator
// address") and showing `example`.
absl::StatusOr<std::vector<std::string>> ParseHostPorts(
    absl::string_view list, absl::string_view what, absl::string_view example);

// The gRPC target that reaches `addresses`: "ipv4:A,B,..." (no DNS
// resolver, whose minimum time between resolutions would hold a
// reconnection back for seconds; with several, gRPC's pick_first connects
// to the first that accepts and moves on when it goes away), or one name
// alone as it is, for gRPC's DNS resolver. In a list, a name is resolved
// now (getaddrinfo) into all its IPv4 addresses, in place; it is not
// resolved again later. UNAVAILABLE for a name that does not resolve to an
// IPv4 address.
absl::StatusOr<std::string> FailoverTarget(
    const std::vector<std::string>& addresses, absl::string_view what);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_HOST_PORTS_H_
