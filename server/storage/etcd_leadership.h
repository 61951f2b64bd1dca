// Leadership among coordinator replicas that share an etcd namespace
// (--etcd). The replica that creates the key PREFIX "leader", attached to a
// lease it keeps alive, leads; the others stand by until that key is gone
// (the leader resigned, or stopped renewing its lease for the lease's TTL)
// and campaign again. The key's create revision fences the leader's writes
// (EtcdOptions::fence_revision): once it is deposed, none of them applies.
#ifndef GRADSYNC_SERVER_STORAGE_ETCD_LEADERSHIP_H_
#define GRADSYNC_SERVER_STORAGE_ETCD_LEADERSHIP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "server/storage/etcd_client.h"

namespace gradsync {

struct LeadershipOptions {
  std::string prefix = "/gradsync/";
  // Published as the leader key's value, for standbys' logs and operators.
  std::string address;
  // How long the lease outlives its last renewal (etcd's minimum is about
  // 2 s): a leader that stops is replaced after at most this.
  absl::Duration lease_ttl = absl::Seconds(2);
  // How often a standby looks whether the leader key is gone.
  absl::Duration standby_poll = absl::Milliseconds(200);
  // Called on the campaigning thread whenever the leader a standby waits
  // for changes, with its published address (empty: none leads).
  std::function<void(const std::string& leader)> on_standing_by;
};

// Thread-safe. Holds the lease from Campaign() until destruction, renewing
// it on a thread of its own.
class EtcdLeadership {
 public:
  using LostCallback = std::function<void(const absl::Status&)>;

  // Blocks until this replica leads, logging which replica it waits for;
  // etcd errors are retried (logged) while standing by. `on_lost` runs once,
  // on the renewal thread, if the leadership ends before destruction (the
  // lease expired, or could not be renewed and might expire within
  // TTL/4: see RenewLoop).
  static absl::StatusOr<std::unique_ptr<EtcdLeadership>> Campaign(
      EtcdConnection etcd, LeadershipOptions options, LostCallback on_lost);

  // Stops renewing and revokes the lease, so a standby takes over at once.
  ~EtcdLeadership();
  EtcdLeadership(const EtcdLeadership&) = delete;
  EtcdLeadership& operator=(const EtcdLeadership&) = delete;

  // The leader key and its create revision: the fence of this leadership.
  const std::string& key() const { return key_; }
  int64_t revision() const { return revision_; }

 private:
  // `valid_until`: before it, the lease surely holds.
  EtcdLeadership(EtcdConnection etcd, LeadershipOptions options,
                 LostCallback on_lost, int64_t lease, int64_t revision,
                 absl::Time valid_until);

  // Renews the lease every TTL/4 until stopped; reports a loss once the
  // lease is gone, or when it could not be renewed and might expire within
  // a margin (TTL/4): the time it surely holds is counted from before each
  // renewal was sent, so a deposed leader stops before etcd lets another
  // one lead.
  void RenewLoop(absl::Time valid_until);
  // One renewal within `deadline`: the lease's remaining TTL in seconds
  // (<= 0: expired).
  absl::StatusOr<int64_t> Renew(absl::Duration deadline);

  const EtcdConnection etcd_;
  const LeadershipOptions options_;
  const LostCallback on_lost_;
  const std::string key_;
  const int64_t lease_;
  const int64_t revision_;
  std::unique_ptr<etcdserverpb::Lease::Stub> leases_;
  absl::Notification stop_;
  std::thread renewer_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STORAGE_ETCD_LEADERSHIP_H_
