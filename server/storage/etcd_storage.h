// Storage in an etcd v3 cluster (the coordinator's --etcd). Everything lives
// under a namespace prefix ("/gradsync/" by default), so one cluster can hold
// other data, or several coordinators' state under different prefixes:
// PREFIX "format" holds the state format (kStateFormat) and the stored keys
// are under PREFIX "d/".
#ifndef GRADSYNC_SERVER_STORAGE_ETCD_STORAGE_H_
#define GRADSYNC_SERVER_STORAGE_ETCD_STORAGE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "server/storage/etcd_client.h"
#include "server/storage/etcd_leadership.h"
#include "server/storage/storage.h"

namespace gradsync {

// etcd's default --max-request-bytes.
inline constexpr int64_t kEtcdDefaultMaxRequestBytes = 1536 * 1024;

struct EtcdOptions {
  // The cluster's client endpoints, "HOST:PORT" (the channel fails over
  // between them; see FailoverTarget for names).
  std::vector<std::string> endpoints;
  // Prepended to every key; must not be empty.
  std::string prefix = "/gradsync/";
  // Deadline of each call to etcd.
  absl::Duration call_timeout = absl::Seconds(5);
  // TLS toward etcd (plaintext when tls.ca is empty).
  ClientTls tls;
  // The largest request the cluster accepts: etcd's --max-request-bytes
  // (1.5 MiB by default), which etcd does not report. Apply splits its
  // transactions under it; a single write above it is refused before it is
  // sent (RESOURCE_EXHAUSTED naming the key and the limit).
  int64_t max_request_bytes = kEtcdDefaultMaxRequestBytes;
  // Fencing (see EtcdLeadership): when fence_revision > 0, every write is a
  // transaction that applies only while the key `fence_key` still has that
  // create revision, i.e. while this replica's leadership lasts. Otherwise
  // the write changes nothing and fails with FAILED_PRECONDITION.
  std::string fence_key;
  int64_t fence_revision = 0;
  // With `lead`, Open first campaigns for the leadership of the namespace
  // (EtcdLeadership, blocking while another replica leads), then fences
  // every write with it; `leadership` says how. `on_lost_leadership` runs
  // once if the leadership ends while the storage is open, or a write is
  // refused by the fence.
  bool lead = false;
  LeadershipOptions leadership;
  EtcdLeadership::LostCallback on_lost_leadership;
};

// Every call is one etcd request (Apply: one transaction per run of
// mutations etcd accepts together), answered once the cluster has committed
// it: durable on a quorum. Writes are fenced when the options say so. Errors carry etcd's gRPC code (UNAVAILABLE when no
// member answers, DEADLINE_EXCEEDED past call_timeout) and name the
// endpoints. Thread-safe; the channel reconnects on its own.
class EtcdStorage final : public Storage {
 public:
  // Connects and checks the namespace: a new one is given the format
  // marker; one with another format, or with keys but no marker, is
  // FAILED_PRECONDITION saying which (nothing is reset). UNAVAILABLE or
  // DEADLINE_EXCEEDED when the cluster does not answer within call_timeout.
  static absl::StatusOr<std::unique_ptr<EtcdStorage>> Open(EtcdOptions options);

  // Checks the namespace `options` names without writing (safe while a
  // coordinator serves from it) and counts what it holds. NOT_FOUND for an
  // empty namespace; otherwise Open's errors. Ignores `lead`.
  static absl::StatusOr<StateSummary> Check(EtcdOptions options);

  absl::Status Put(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) const override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::StatusOr<std::vector<Entry>> Scan(absl::string_view prefix,
                                          bool keys_only) const override;
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override;
  // etcd refuses a transaction that writes one key twice, holds more than
  // 128 operations or is larger than max_request_bytes: such a batch is
  // split into transactions run in order, so an error may leave the batch's
  // first part applied; never inside a run of mutations joined by
  // with_next, which is one transaction (a group of over 128 operations or
  // max_request_bytes is refused by etcd).
  absl::Status Apply(const std::vector<Mutation>& batch) override;

  // With options.lead: the term of this replica's leadership (its leader
  // key's create revision); 0 otherwise.
  int64_t leader_term() const { return options_.fence_revision; }

 private:
  EtcdStorage(EtcdOptions options, EtcdConnection etcd);

  // Runs one transaction of `ops` (none conflicting), fenced; `what` names
  // it in errors.
  absl::StatusOr<etcdserverpb::TxnResponse> Commit(
      const char* what, std::vector<etcdserverpb::RequestOp> ops);
  // Checks or writes the format marker (see Open); returns the format.
  // With `create`, an empty namespace gets the format marker and an older
  // format is raised to kStateFormat; without, an empty namespace is
  // NOT_FOUND.
  absl::StatusOr<int> CheckFormat(bool create);
  // Sets the marker from `format` to kStateFormat, unless it changed.
  absl::StatusOr<int> RaiseFormat(int format);
  // How many keys start with `prefix` (in the data), as of one revision.
  absl::StatusOr<int64_t> Count(absl::string_view prefix) const;

  EtcdOptions options_;  // constant once Open returns
  const std::string data_prefix_;  // PREFIX "d/"
  const EtcdConnection etcd_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  // Held while the storage is open, with `lead`.
  std::unique_ptr<EtcdLeadership> leadership_;
  // Set by the first write the fence refused (on_lost_leadership runs once).
  std::atomic<bool> fenced_off_{false};
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STORAGE_ETCD_STORAGE_H_
