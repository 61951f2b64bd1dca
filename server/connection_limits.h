// Bounds the long-lived calls one client connection may hold open at once.
#ifndef GRADSYNC_SERVER_CONNECTION_LIMITS_H_
#define GRADSYNC_SERVER_CONNECTION_LIMITS_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

// Counts the streams each connection holds: heartbeat streams (a member's
// or a node's) and job watches. A connection is gRPC's peer address of the
// call ("ipv4:10.0.0.5:41234"), one per TCP connection. A worker holds one
// heartbeat stream, a node agent one for its node, a `gradsync watch` one
// watch; past `max_per_connection` a new stream is refused with
// RESOURCE_EXHAUSTED naming --max_streams_per_connection, so one client
// cannot take the coordinator's memory and threads.
//
// Thread-safe; must outlive the leases it hands out.
class ConnectionLimits {
 public:
  // A stream's place; given back when destroyed. Movable.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    ~Lease() { Release(); }

   private:
    friend class ConnectionLimits;
    Lease(ConnectionLimits* limits, std::string peer)
        : limits_(limits), peer_(std::move(peer)) {}
    void Release();

    ConnectionLimits* limits_ = nullptr;
    std::string peer_;
  };

  // 0 means no limit.
  explicit ConnectionLimits(int max_per_connection)
      : max_per_connection_(max_per_connection) {}

  // A place for one more stream of `peer`.
  absl::StatusOr<Lease> Acquire(const std::string& peer);
  // Streams `peer` holds now.
  int Open(const std::string& peer) const;

 private:
  void Release(const std::string& peer);

  const int max_per_connection_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_CONNECTION_LIMITS_H_
