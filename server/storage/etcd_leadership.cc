#include "server/storage/etcd_leadership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace gradsync {
namespace {

// The leader key's value, or "" when there is no leader.
absl::StatusOr<std::string> CurrentLeader(const EtcdConnection& etcd,
                                          etcdserverpb::KV::Stub* kv,
                                          const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  grpc::Status status = kv->Range(etcd.Context().get(), request, &response);
  if (!status.ok()) return etcd.Failed("reading the leader", status);
  return response.kvs_size() == 0 ? std::string() : response.kvs(0).value();
}

// One attempt to lead: creates `key` = `address` under a new lease unless
// the key exists. The key's create revision when this replica now leads
// (with *lease set), 0 when another one does.
absl::StatusOr<int64_t> TryToLead(const EtcdConnection& etcd,
                                  etcdserverpb::KV::Stub* kv,
                                  etcdserverpb::Lease::Stub* leases,
                                  const std::string& key,
                                  const LeadershipOptions& options,
                                  int64_t* lease, absl::Time* asked) {
  *asked = absl::Now();  // the lease's TTL counts from after this
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(absl::ToInt64Seconds(absl::Ceil(options.lease_ttl, absl::Seconds(1))));
  etcdserverpb::LeaseGrantResponse granted;
  grpc::Status status = leases->LeaseGrant(etcd.Context().get(), grant, &granted);
  if (!status.ok()) return etcd.Failed("granting a lease", status);
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_key(key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(options.address);
  put->set_lease(granted.id());
  etcdserverpb::TxnResponse response;
  status = kv->Txn(etcd.Context().get(), request, &response);
  if (status.ok() && response.succeeded()) {
    *lease = granted.id();
    return response.header().revision();
  }
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(granted.id());
  etcdserverpb::LeaseRevokeResponse revoked;
  (void)leases->LeaseRevoke(etcd.Context().get(), revoke, &revoked);
  if (!status.ok()) return etcd.Failed("campaigning", status);
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdLeadership>> EtcdLeadership::Campaign(
    EtcdConnection etcd, LeadershipOptions options, LostCallback on_lost) {
  const std::string key = absl::StrCat(options.prefix, "leader");
  auto kv = etcdserverpb::KV::NewStub(etcd.channel());
  auto leases = etcdserverpb::Lease::NewStub(etcd.channel());
  std::string waiting_for;  // the leader last logged
  for (;;) {
    absl::StatusOr<std::string> leader = CurrentLeader(etcd, kv.get(), key);
    if (leader.ok() && leader->empty()) {
      int64_t lease = 0;
      absl::Time asked;
      absl::StatusOr<int64_t> revision = TryToLead(
          etcd, kv.get(), leases.get(), key, options, &lease, &asked);
      if (revision.ok() && *revision > 0) {
        // (The term's beginning is logged as the time before the
        // campaign: no earlier leader's lease could hold after it.)
        GS_LOG(INFO) << "leading the coordinators under '" << options.prefix
                     << "' in etcd at " << etcd.endpoints() << " (lease "
                     << absl::StrCat(absl::Hex(lease)) << "): term "
                     << *revision << " began at unix microseconds "
                     << absl::ToUnixMicros(asked);
        const absl::Time valid_until = asked + options.lease_ttl;
        return std::unique_ptr<EtcdLeadership>(new EtcdLeadership(
            std::move(etcd), std::move(options), std::move(on_lost), lease,
            *revision, valid_until));
      }
      if (!revision.ok()) leader = revision.status();
    }
    if (!leader.ok()) {
      GS_LOG(WARNING) << "standing by: " << leader.status() << "; retrying";
    } else if (*leader != waiting_for) {
      if (!leader->empty()) {
        GS_LOG(INFO) << "standing by: the coordinator at '" << *leader
                     << "' leads under '" << options.prefix << "'";
      }
      waiting_for = *leader;
      if (options.on_standing_by) options.on_standing_by(waiting_for);
    }
    absl::SleepFor(options.standby_poll);
  }
}

EtcdLeadership::EtcdLeadership(EtcdConnection etcd, LeadershipOptions options,
                               LostCallback on_lost, int64_t lease,
                               int64_t revision, absl::Time valid_until)
    : etcd_(std::move(etcd)),
      options_(std::move(options)),
      on_lost_(std::move(on_lost)),
      key_(absl::StrCat(options_.prefix, "leader")),
      lease_(lease),
      revision_(revision),
      leases_(etcdserverpb::Lease::NewStub(etcd_.channel())),
      renewer_([this, valid_until] { RenewLoop(valid_until); }) {}

EtcdLeadership::~EtcdLeadership() {
  stop_.Notify();
  renewer_.join();
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(lease_);
  etcdserverpb::LeaseRevokeResponse revoked;
  grpc::Status status =
      leases_->LeaseRevoke(etcd_.Context().get(), revoke, &revoked);
  if (!status.ok()) {
    GS_LOG(WARNING) << etcd_.Failed("resigning", status)
                    << ": a standby takes over once the lease expires";
  }
}

void EtcdLeadership::RenewLoop(absl::Time valid_until) {
  // A lease outlives its last renewal by its TTL counted from when etcd
  // took the renewal, which is after it was sent: `sent + TTL` is never
  // later than the lease's end. The leadership ends a margin before that,
  // so that a deposed leader has stopped before another one can lead.
  const absl::Duration margin = options_.lease_ttl / 4;
  while (true) {
    const absl::Duration wait =
        std::min(options_.lease_ttl / 4, valid_until - margin - absl::Now());
    if (stop_.WaitForNotificationWithTimeout(
            std::max(wait, absl::ZeroDuration()))) {
      return;
    }
    const absl::Time sent = absl::Now();
    const absl::Duration left = valid_until - margin - sent;
    absl::StatusOr<int64_t> ttl =
        left > absl::ZeroDuration()
            ? Renew(std::min(options_.lease_ttl / 2, left))
            : absl::DeadlineExceededError("no time left to renew");
    if (ttl.ok() && *ttl > 0) {
      valid_until = sent + std::min(absl::Seconds(*ttl), options_.lease_ttl);
      continue;
    }
    absl::Status why;
    if (ttl.ok()) {
      why = absl::AbortedError(absl::StrCat(
          "the lease of '", key_, "' expired: another coordinator may lead"));
    } else if (absl::Now() >= valid_until - margin) {
      why = absl::UnavailableError(absl::StrCat(
          "the lease of '", key_, "' could not be renewed (",
          ttl.status().message(), "), and it may expire within ",
          absl::FormatDuration(margin),
          ": stopping before another coordinator can lead"));
    } else {
      continue;  // a transient error: retry while the lease surely holds
    }
    if (!stop_.HasBeenNotified() && on_lost_) on_lost_(why);
    return;
  }
}

absl::StatusOr<int64_t> EtcdLeadership::Renew(absl::Duration deadline) {
  std::unique_ptr<grpc::ClientContext> context = etcd_.Context(deadline);
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                           etcdserverpb::LeaseKeepAliveResponse>>
      stream = leases_->LeaseKeepAlive(context.get());
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease_);
  etcdserverpb::LeaseKeepAliveResponse response;
  const bool answered = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  if (!answered) {
    return etcd_.Failed("renewing the lease",
                        status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                   "no answer")
                                    : status);
  }
  return response.ttl();
}

}  // namespace gradsync
