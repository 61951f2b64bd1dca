#include "server/storage/etcd_storage.h"

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/storage/etcd_client.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// etcd's default --max-txn-ops.
constexpr size_t kMaxTxnOps = 128;
// What a transaction's request holds beside its operations (the fence's
// comparison, framing), and each operation beside its own bytes, at most.
constexpr int64_t kTxnOverheadBytes = 1024;
constexpr int64_t kOpOverheadBytes = 16;
// Keys read per Range call of a scan.
constexpr int64_t kScanPage = 1000;

// The half-open key interval a mutation writes: [key, key + "\0") for one
// key, [prefix, PrefixEnd(prefix)) for a prefix ("" end: to the end).
std::pair<std::string, std::string> Span(const Storage::Mutation& m,
                                         const std::string& ns) {
  std::string begin = absl::StrCat(ns, m.key);
  if (m.kind != Storage::Mutation::Kind::kDeletePrefix) {
    std::string end = begin;
    end.push_back('\0');
    return {std::move(begin), std::move(end)};
  }
  std::optional<std::string> end = PrefixEnd(begin);
  return {std::move(begin), end.value_or(std::string())};
}

bool Overlap(const std::pair<std::string, std::string>& a,
             const std::pair<std::string, std::string>& b) {
  const bool a_before_b = !a.second.empty() && a.second <= b.first;
  const bool b_before_a = !b.second.empty() && b.second <= a.first;
  return !a_before_b && !b_before_a;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdStorage>> EtcdStorage::Open(
    EtcdOptions options) {
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError("the etcd key prefix must not be empty");
  }
  GS_ASSIGN_OR_RETURN(EtcdConnection etcd,
                      EtcdConnection::Create(options.endpoints,
                                             options.call_timeout, options.tls));
  std::unique_ptr<EtcdStorage> storage(
      new EtcdStorage(std::move(options), etcd));
  GS_RETURN_IF_ERROR(storage->CheckFormat(/*create=*/true).status());
  if (storage->options_.lead) {
    LeadershipOptions leading = storage->options_.leadership;
    leading.prefix = storage->options_.prefix;
    GS_ASSIGN_OR_RETURN(storage->leadership_,
                        EtcdLeadership::Campaign(
                            std::move(etcd), std::move(leading),
                            storage->options_.on_lost_leadership));
    storage->options_.fence_key = storage->leadership_->key();
    storage->options_.fence_revision = storage->leadership_->revision();
  }
  return storage;
}

absl::StatusOr<StateSummary> EtcdStorage::Check(EtcdOptions options) {
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError("the etcd key prefix must not be empty");
  }
  GS_ASSIGN_OR_RETURN(EtcdConnection etcd,
                      EtcdConnection::Create(options.endpoints,
                                             options.call_timeout, options.tls));
  options.lead = false;
  EtcdStorage storage(std::move(options), std::move(etcd));
  StateSummary summary;
  GS_ASSIGN_OR_RETURN(summary.format, storage.CheckFormat(/*create=*/false));
  GS_ASSIGN_OR_RETURN(summary.entries, storage.Count(""));
  GS_ASSIGN_OR_RETURN(std::vector<Entry> jobs_keys,
                      storage.Scan("jobs/", /*keys_only=*/true));
  for (const Entry& entry : jobs_keys) {  // records, not their parts
    if (entry.first.find('/', 5) == std::string::npos) ++summary.jobs;
  }
  GS_ASSIGN_OR_RETURN(summary.kv_keys, storage.Count("kv/"));
  return summary;
}

absl::StatusOr<int64_t> EtcdStorage::Count(absl::string_view prefix) const {
  const std::string begin = absl::StrCat(data_prefix_, prefix);
  etcdserverpb::RangeRequest request;
  request.set_key(begin);
  request.set_range_end(PrefixEnd(begin).value_or(std::string(1, '\0')));
  request.set_count_only(true);
  etcdserverpb::RangeResponse response;
  grpc::Status status = kv_->Range(etcd_.Context().get(), request, &response);
  if (!status.ok()) return etcd_.Failed("count", status);
  return response.count();
}

EtcdStorage::EtcdStorage(EtcdOptions options, EtcdConnection etcd)
    : options_(std::move(options)),
      data_prefix_(absl::StrCat(options_.prefix, "d/")),
      etcd_(std::move(etcd)),
      kv_(etcdserverpb::KV::NewStub(etcd_.channel())) {}

absl::Status EtcdStorage::Put(absl::string_view key, absl::string_view value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(absl::StrCat(data_prefix_, key));
  op.mutable_request_put()->set_value(std::string(value));
  std::vector<etcdserverpb::RequestOp> ops;
  ops.push_back(std::move(op));
  return Commit("put", std::move(ops)).status();
}

absl::StatusOr<std::string> EtcdStorage::Get(absl::string_view key) const {
  etcdserverpb::RangeRequest request;
  request.set_key(absl::StrCat(data_prefix_, key));
  etcdserverpb::RangeResponse response;
  grpc::Status status = kv_->Range(etcd_.Context().get(), request, &response);
  if (!status.ok()) return etcd_.Failed("get", status);
  if (response.kvs_size() == 0) {
    return absl::NotFoundError(absl::StrCat("key '", key, "' not found"));
  }
  return std::move(*response.mutable_kvs(0)->mutable_value());
}

absl::StatusOr<bool> EtcdStorage::Delete(absl::string_view key) {
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(absl::StrCat(data_prefix_, key));
  std::vector<etcdserverpb::RequestOp> ops;
  ops.push_back(std::move(op));
  GS_ASSIGN_OR_RETURN(etcdserverpb::TxnResponse response,
                      Commit("delete", std::move(ops)));
  return response.responses(0).response_delete_range().deleted() > 0;
}

absl::StatusOr<std::vector<Storage::Entry>> EtcdStorage::Scan(
    absl::string_view prefix, bool keys_only) const {
  const std::string begin = absl::StrCat(data_prefix_, prefix);
  // The namespace prefix is not empty, so the scan always has an end.
  const std::string end = PrefixEnd(begin).value_or(std::string(1, '\0'));
  std::vector<Entry> entries;
  etcdserverpb::RangeRequest request;
  request.set_key(begin);
  request.set_range_end(end);
  request.set_keys_only(keys_only);
  request.set_limit(kScanPage);
  int64_t revision = 0;  // every page reads the first page's revision
  for (;;) {
    request.set_revision(revision);
    etcdserverpb::RangeResponse response;
    grpc::Status status = kv_->Range(etcd_.Context().get(), request, &response);
    if (!status.ok()) return etcd_.Failed("scan", status);
    revision = response.header().revision();
    for (mvccpb::KeyValue& kv : *response.mutable_kvs()) {
      entries.emplace_back(kv.key().substr(data_prefix_.size()),
                           keys_only ? std::string() : std::move(*kv.mutable_value()));
    }
    if (!response.more() || response.kvs_size() == 0) return entries;
    std::string next = response.kvs(response.kvs_size() - 1).key();
    next.push_back('\0');
    request.set_key(std::move(next));
  }
}

absl::StatusOr<int64_t> EtcdStorage::DeletePrefix(absl::string_view prefix) {
  const std::string begin = absl::StrCat(data_prefix_, prefix);
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(begin);
  op.mutable_request_delete_range()->set_range_end(
      PrefixEnd(begin).value_or(std::string(1, '\0')));
  std::vector<etcdserverpb::RequestOp> ops;
  ops.push_back(std::move(op));
  GS_ASSIGN_OR_RETURN(etcdserverpb::TxnResponse response,
                      Commit("delete prefix", std::move(ops)));
  return response.responses(0).response_delete_range().deleted();
}

absl::Status EtcdStorage::Apply(const std::vector<Mutation>& batch) {
  std::vector<etcdserverpb::RequestOp> ops;
  std::vector<std::pair<std::string, std::string>> spans;
  int64_t bytes = kTxnOverheadBytes;
  // Run by run of mutations joined by with_next (a group), each group whole
  // in one transaction: a new transaction starts before a group that would
  // not fit the current one or writes a key it writes.
  for (size_t first = 0; first < batch.size();) {
    size_t last = first;
    while (last + 1 < batch.size() && batch[last].with_next) ++last;
    std::vector<std::pair<std::string, std::string>> group_spans;
    int64_t group_bytes = 0;
    for (size_t i = first; i <= last; ++i) {
      group_spans.push_back(Span(batch[i], data_prefix_));
      group_bytes += static_cast<int64_t>(group_spans.back().first.size() +
                                          group_spans.back().second.size() +
                                          batch[i].value.size()) +
                     kOpOverheadBytes;
    }
    const size_t group_ops = last - first + 1;
    bool conflict =
        !ops.empty() && (ops.size() + group_ops > kMaxTxnOps ||
                         bytes + group_bytes > options_.max_request_bytes);
    for (size_t i = 0; !conflict && i < spans.size(); ++i) {
      for (const auto& span : group_spans) conflict |= Overlap(spans[i], span);
    }
    if (conflict) {
      GS_RETURN_IF_ERROR(Commit("transaction", std::move(ops)).status());
      ops.clear();
      spans.clear();
      bytes = kTxnOverheadBytes;
    }
    bytes += group_bytes;
    for (size_t i = first; i <= last; ++i) {
      const Mutation& m = batch[i];
      std::pair<std::string, std::string>& span = group_spans[i - first];
      etcdserverpb::RequestOp op;
      if (m.kind == Mutation::Kind::kPut) {
        op.mutable_request_put()->set_key(span.first);
        op.mutable_request_put()->set_value(m.value);
      } else {
        op.mutable_request_delete_range()->set_key(span.first);
        if (m.kind == Mutation::Kind::kDeletePrefix) {
          op.mutable_request_delete_range()->set_range_end(
              span.second.empty() ? std::string(1, '\0') : span.second);
        }
      }
      ops.push_back(std::move(op));
      spans.push_back(std::move(span));
    }
    first = last + 1;
  }
  if (ops.empty()) return absl::OkStatus();
  return Commit("transaction", std::move(ops)).status();
}

absl::StatusOr<int> EtcdStorage::CheckFormat(bool create) {
  const std::string marker = absl::StrCat(options_.prefix, "format");
  // Where the namespace is empty, create the marker (or only say so);
  // otherwise read the marker, in one transaction.
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_key(options_.prefix);
  absent->set_range_end(PrefixEnd(options_.prefix).value_or(std::string(1, '\0')));
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  if (create) {
    etcdserverpb::PutRequest* put =
        request.add_success()->mutable_request_put();
    put->set_key(marker);
    put->set_value(absl::StrCat(kStateFormat));
  }
  etcdserverpb::RangeRequest* read =
      request.add_failure()->mutable_request_range();
  read->set_key(marker);
  etcdserverpb::TxnResponse response;
  grpc::Status status = kv_->Txn(etcd_.Context().get(), request, &response);
  if (!status.ok()) return etcd_.Failed("reading the state format", status);
  if (response.succeeded()) {  // an empty namespace
    if (create) return kStateFormat;
    return absl::NotFoundError(absl::StrCat("etcd at ", etcd_.endpoints(),
                                            ": no gradsync state under '",
                                            options_.prefix, "'"));
  }
  const etcdserverpb::RangeResponse& found =
      response.responses(0).response_range();
  if (found.kvs_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd at ", etcd_.endpoints(), ": keys under '", options_.prefix,
        "' are not a gradsync state (no '", marker,
        "'): give another --etcd_prefix, or remove them if they are stale"));
  }
  int format = 0;
  if (!absl::SimpleAtoi(found.kvs(0).value(), &format) ||
      format < kOldestStateFormat || format > kStateFormat) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd at ", etcd_.endpoints(), ": the state under '", options_.prefix,
        "' has format '", found.kvs(0).value(),
        "', this gradsync-coordinator reads formats ", kOldestStateFormat, "-",
        kStateFormat, ": run the gradsync that wrote it"));
  }
  if (create && format < kStateFormat) return RaiseFormat(format);
  return format;
}

absl::StatusOr<int> EtcdStorage::RaiseFormat(int format) {
  const std::string marker = absl::StrCat(options_.prefix, "format");
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* same = request.add_compare();
  same->set_key(marker);
  same->set_target(etcdserverpb::Compare::VALUE);
  same->set_result(etcdserverpb::Compare::EQUAL);
  same->set_value(absl::StrCat(format));
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(marker);
  put->set_value(absl::StrCat(kStateFormat));
  etcdserverpb::TxnResponse response;
  grpc::Status status = kv_->Txn(etcd_.Context().get(), request, &response);
  if (!status.ok()) return etcd_.Failed("raising the state format", status);
  if (!response.succeeded()) {
    return absl::AbortedError(absl::StrCat(
        "etcd at ", etcd_.endpoints(), ": the state format under '",
        options_.prefix, "' changed while it was raised from ", format,
        ": start again"));
  }
  GS_LOG(INFO) << "etcd state under '" << options_.prefix << "': format "
               << format << " raised to " << kStateFormat;
  return kStateFormat;
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdStorage::Commit(
    const char* what, std::vector<etcdserverpb::RequestOp> ops) {
  etcdserverpb::TxnRequest request;
  if (options_.fence_revision > 0) {
    etcdserverpb::Compare* leads = request.add_compare();
    leads->set_key(options_.fence_key);
    leads->set_target(etcdserverpb::Compare::CREATE);
    leads->set_result(etcdserverpb::Compare::EQUAL);
    leads->set_create_revision(options_.fence_revision);
  }
  for (etcdserverpb::RequestOp& op : ops) *request.add_success() = std::move(op);
  const int64_t size = static_cast<int64_t>(request.ByteSizeLong());
  if (size + kOpOverheadBytes > options_.max_request_bytes) {
    const std::string subject =
        request.success_size() == 1 && request.success(0).has_request_put()
            ? absl::StrCat("the value of '",
                           absl::string_view(request.success(0).request_put().key())
                               .substr(data_prefix_.size()),
                           "'")
            : absl::StrCat(request.success_size(), " operation(s)");
    return absl::ResourceExhaustedError(absl::StrCat(
        "etcd at ", etcd_.endpoints(), ": ", what, " not sent: ", subject,
        " makes a request of ", size, " bytes, more than etcd accepts (",
        options_.max_request_bytes,
        " bytes, --etcd_max_request_bytes; etcd's --max-request-bytes)"));
  }
  etcdserverpb::TxnResponse response;
  grpc::Status status = kv_->Txn(etcd_.Context().get(), request, &response);
  if (!status.ok()) return etcd_.Failed(what, status);
  if (!response.succeeded()) {
    absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
        "etcd at ", etcd_.endpoints(), ": ", what, " refused: this coordinator no "
        "longer leads ('", options_.fence_key, "' is not the one it created "
        "at revision ", options_.fence_revision, ")"));
    if (options_.on_lost_leadership && !fenced_off_.exchange(true)) {
      options_.on_lost_leadership(refused);
    }
    return refused;
  }
  return response;
}

}  // namespace gradsync
