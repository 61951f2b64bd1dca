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

// The gRPC target that reaches `addresses`: IPv4 addresses as
// "ipv4:A,B,..." (no DNS resolver, whose minimum time between resolutions
// would hold a reconnection back for seconds; with several, gRPC's
// pick_first connects to the first that accepts and moves on when it goes
// away); one name as it is. Several must be IPv4 addresses:
// INVALID_ARGUMENT naming the first that is not.
absl::StatusOr<std::string> FailoverTarget(
    const std::vector<std::string>& addresses, absl::string_view what);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_HOST_PORTS_H_
