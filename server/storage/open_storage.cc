#include "server/storage/open_storage.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/host_ports.h"
#include "common/logging.h"
#include "server/storage/sqlite_storage.h"
#ifdef GRADSYNC_WITH_ETCD
#include "server/storage/etcd_storage.h"
#endif

namespace gradsync {
namespace {

// `status` with "cannot use FLAG: " before its message.
absl::Status Naming(const char* flag, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("cannot use ", flag, ": ", status.message()));
}

#ifdef GRADSYNC_WITH_ETCD
// The endpoints and prefix of `spec`.
absl::StatusOr<EtcdOptions> EtcdNamespace(const StorageSpec& spec) {
  EtcdOptions options;
  absl::StatusOr<std::vector<std::string>> endpoints =
      ParseHostPorts(spec.etcd, "etcd endpoint", "10.0.0.5:2379");
  if (!endpoints.ok()) return Naming("--etcd", endpoints.status());
  options.endpoints = *std::move(endpoints);
  options.prefix = spec.etcd_prefix;
  options.tls = spec.etcd_tls;
  if (spec.etcd_max_request_bytes < 64 * 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd_max_request_bytes must be at least 65536 (etcd's default is ",
        kEtcdDefaultMaxRequestBytes, "), not ", spec.etcd_max_request_bytes));
  }
  options.max_request_bytes = spec.etcd_max_request_bytes;
  // Room for the namespace and data prefixes, the job and round in a key,
  // the leader's fence and etcd's framing.
  const int64_t overhead = 4096 + static_cast<int64_t>(spec.etcd_prefix.size());
  if (spec.largest_client_write_bytes > 0 &&
      spec.largest_client_write_bytes + overhead > spec.etcd_max_request_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a key-value write of --max_kv_key_bytes + --max_kv_value_bytes = ",
        spec.largest_client_write_bytes, " bytes (and ", overhead,
        " of prefixes and framing) does not fit --etcd_max_request_bytes = ",
        spec.etcd_max_request_bytes,
        ": lower --max_kv_value_bytes, or raise etcd's --max-request-bytes "
        "and this flag with it"));
  }
  return options;
}
#endif

#ifndef GRADSYNC_WITH_ETCD
absl::Status NoEtcd() {
  return absl::UnimplementedError(
      "--etcd: this build of gradsync has no etcd client (etcd's .proto "
      "files, from golang-etcd-server-dev, were missing at build time)");
}
#endif

absl::StatusOr<std::unique_ptr<Storage>> OpenEtcd(const StorageSpec& spec) {
#ifdef GRADSYNC_WITH_ETCD
  absl::StatusOr<EtcdOptions> named = EtcdNamespace(spec);
  if (!named.ok()) return named.status();
  EtcdOptions options = *std::move(named);
  options.lead = spec.lead;
  if (spec.lease_ttl < absl::Seconds(2) || spec.lease_ttl > absl::Seconds(8) ||
      absl::Trunc(spec.lease_ttl, absl::Seconds(1)) != spec.lease_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd_lease_ttl must be whole seconds from 2s (etcd's minimum) to "
        "8s (a write that etcd did not answer is tried again for 10s, past "
        "the lease), not ", absl::FormatDuration(spec.lease_ttl)));
  }
  options.leadership.lease_ttl = spec.lease_ttl;
  options.leadership.address = spec.advertise;
  options.leadership.on_standing_by = spec.on_standing_by;
  options.on_lost_leadership = spec.on_lost;
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened = EtcdStorage::Open(options);
  if (!opened.ok()) return Naming("--etcd", opened.status());
  if (spec.lead && spec.on_leading) spec.on_leading((*opened)->leader_term());
  GS_LOG(INFO) << "keeping state in etcd at " << spec.etcd << " under '"
               << spec.etcd_prefix << "'";
  return std::unique_ptr<Storage>(*std::move(opened));
#else
  return NoEtcd();
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(const StorageSpec& spec) {
  if (!spec.state_dir.empty() && !spec.etcd.empty()) {
    return absl::InvalidArgumentError("give --state_dir or --etcd, not both");
  }
  if (!spec.etcd.empty()) return OpenEtcd(spec);
  if (spec.state_dir.empty()) return std::unique_ptr<Storage>();
  absl::StatusOr<std::unique_ptr<SqliteStorage>> opened =
      SqliteStorage::Open(spec.state_dir);
  if (!opened.ok()) return Naming("--state_dir", opened.status());
  GS_LOG(INFO) << "keeping state in " << spec.state_dir;
  return std::unique_ptr<Storage>(*std::move(opened));
}

absl::StatusOr<StateSummary> CheckState(const StorageSpec& spec) {
  if (spec.state_dir.empty() == spec.etcd.empty()) {
    return absl::InvalidArgumentError(
        "--check_state needs --state_dir=DIR or --etcd=HOST:PORT");
  }
  if (!spec.state_dir.empty()) return CheckStateDir(spec.state_dir);
#ifdef GRADSYNC_WITH_ETCD
  absl::StatusOr<EtcdOptions> named = EtcdNamespace(spec);
  if (!named.ok()) return named.status();
  return EtcdStorage::Check(*std::move(named));
#else
  return NoEtcd();
#endif
}

}  // namespace gradsync
