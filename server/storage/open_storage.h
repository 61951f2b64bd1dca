// Opens the durable storage a coordinator is configured with: SQLite in a
// state directory, an etcd cluster, or none (state in memory).
#ifndef GRADSYNC_SERVER_STORAGE_OPEN_STORAGE_H_
#define GRADSYNC_SERVER_STORAGE_OPEN_STORAGE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/channel_credentials.h"
#include "server/storage/storage.h"

namespace gradsync {

// Where the state goes (the coordinator's --state_dir, --etcd and
// --etcd_prefix). At most one of state_dir and etcd is set.
struct StorageSpec {
  std::string state_dir;
  std::string etcd;  // "HOST:PORT[,HOST:PORT...]"
  std::string etcd_prefix = "/gradsync/";
  // etcd's --max-request-bytes (--etcd_max_request_bytes; see EtcdOptions).
  int64_t etcd_max_request_bytes = 1536 * 1024;
  // The largest key and value the coordinator takes from a client in one
  // write (--max_kv_key_bytes + --max_kv_value_bytes): with etcd, opening
  // is INVALID_ARGUMENT naming the flags unless such a write fits under
  // etcd_max_request_bytes, so that etcd never refuses a write it was
  // promised. 0: not checked.
  int64_t largest_client_write_bytes = 0;
  // TLS toward etcd: its CA, and this coordinator's client certificate and
  // key when etcd asks for one (--etcd_tls_ca, --etcd_tls_cert,
  // --etcd_tls_key).
  ClientTls etcd_tls;
  // With etcd: first campaign for the leadership of the prefix (blocking
  // while another coordinator leads), publishing `advertise`, and fence
  // every write with it; `on_lost` runs if the leadership ends.
  bool lead = false;
  std::string advertise;
  // With etcd and `lead`: the leader lease's TTL (--etcd_lease_ttl; see
  // LeadershipOptions::lease_ttl): whole seconds, 2 to 8 (less than
  // GroupCommit::kRetryFor).
  absl::Duration lease_ttl = absl::Seconds(2);
  std::function<void(const absl::Status&)> on_lost;
  // With etcd and `lead`: told the term once this replica leads (the
  // leader key's create revision; see common/leader_term.h).
  std::function<void(int64_t term)> on_leading;
  // With etcd and `lead`: told, while standing by, the address of the
  // replica that leads whenever it changes (empty: none).
  std::function<void(const std::string& leader)> on_standing_by;
};

// The opened storage; null when neither is set. Errors name the flag and
// keep the backend's code: INVALID_ARGUMENT for both set or bad endpoints,
// UNIMPLEMENTED for etcd in a build without it, and SqliteStorage::Open's
// and EtcdStorage::Open's errors.
absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(const StorageSpec& spec);

// Checks the state `spec` names (its state_dir or its etcd namespace; the
// other fields are ignored) without writing, safe while a coordinator
// serves from it, and counts what it holds. INVALID_ARGUMENT unless exactly
// one is set; SqliteStorage's CheckStateDir's and EtcdStorage::Check's
// errors.
absl::StatusOr<StateSummary> CheckState(const StorageSpec& spec);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STORAGE_OPEN_STORAGE_H_
