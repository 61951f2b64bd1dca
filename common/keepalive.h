// gRPC keepalive, as the coordinator and its clients agree on it. A client
// finds a coordinator that stopped answering while its TCP connection stays
// up (a frozen process, a partition) by pinging it while a call or the
// heartbeat stream is open; the coordinator must accept those pings even
// when it sends no data for a while (a heartbeat stream gets answers only
// when the job changes), or it would close the connection as abusive.
#ifndef GRADSYNC_COMMON_KEEPALIVE_H_
#define GRADSYNC_COMMON_KEEPALIVE_H_

#include "absl/time/time.h"

namespace gradsync {

// A client pings every kKeepaliveTime and drops the connection when a ping
// is not answered within kKeepaliveTimeout.
inline constexpr absl::Duration kKeepaliveTime = absl::Seconds(3);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(3);

// The coordinator accepts pings this often from a client it sends no data
// to: well under kKeepaliveTime, so clients' pings never count as abuse.
inline constexpr absl::Duration kMinPingInterval = absl::Seconds(1);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_KEEPALIVE_H_
