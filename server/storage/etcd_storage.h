// Storage in an etcd v3 cluster (the coordinator's --etcd). Everything lives
// under a namespace prefix ("/gradsync/" by default), so one cluster can hold
// other data, or several coordinators' state under different prefixes:
// PREFIX "format" holds the state format (kStateFormat) and the stored keys
// are under PREFIX "d/".
#ifndef GRADSYNC_SERVER_STORAGE_ETCD_STORAGE_H_
#define GRADSYNC_SERVER_STORAGE_ETCD_STORAGE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "server/storage/storage.h"

namespace gradsync {

struct EtcdOptions {
  // The cluster's client endpoints, "HOST:PORT". Several must be IPv4
  // addresses (the channel fails over between them); one may be a name.
  std::vector<std::string> endpoints;
  // Prepended to every key; must not be empty.
  std::string prefix = "/gradsync/";
  // Deadline of each call to etcd.
  absl::Duration call_timeout = absl::Seconds(5);
};

// Splits "HOST:PORT[,HOST:PORT...]" into endpoints; INVALID_ARGUMENT naming
// the bad entry.
absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(
    const std::string& list);

// Every call is one etcd request (Apply: one transaction per run of
// mutations etcd accepts together), answered once the cluster has committed
// it: durable on a quorum. Errors carry etcd's gRPC code (UNAVAILABLE when no
// member answers, DEADLINE_EXCEEDED past call_timeout) and name the
// endpoints. Thread-safe; the channel reconnects on its own.
class EtcdStorage final : public Storage {
 public:
  // Connects and checks the namespace: a new one is given the format
  // marker; one with another format, or with keys but no marker, is
  // FAILED_PRECONDITION saying which (nothing is reset). UNAVAILABLE or
  // DEADLINE_EXCEEDED when the cluster does not answer within call_timeout.
  static absl::StatusOr<std::unique_ptr<EtcdStorage>> Open(EtcdOptions options);

  absl::Status Put(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) const override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::StatusOr<std::vector<Entry>> Scan(absl::string_view prefix,
                                          bool keys_only) const override;
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override;
  // etcd refuses a transaction that writes one key twice or holds more than
  // 128 operations: such a batch is split into transactions run in order,
  // so an error may leave the batch's first part applied.
  absl::Status Apply(const std::vector<Mutation>& batch) override;

 private:
  EtcdStorage(EtcdOptions options, std::shared_ptr<grpc::Channel> channel);

  // A context with the call deadline.
  std::unique_ptr<grpc::ClientContext> Context() const;
  // The status of a finished call, naming `what` and the endpoints.
  absl::Status Failed(const char* what, const grpc::Status& status) const;
  // Runs one transaction of `ops` (none conflicting).
  absl::Status Commit(std::vector<etcdserverpb::RequestOp> ops);
  // Checks or writes the format marker (see Open).
  absl::Status CheckFormat();

  const EtcdOptions options_;
  const std::string data_prefix_;  // PREFIX "d/"
  const std::string endpoints_;  // for errors
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STORAGE_ETCD_STORAGE_H_
