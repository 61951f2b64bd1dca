#include "server/storage/etcd_storage.h"

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// etcd's default --max-txn-ops.
constexpr size_t kMaxTxnOps = 128;
// Keys read per Range call of a scan.
constexpr int64_t kScanPage = 1000;

bool IsIpv4(absl::string_view host) {
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4) return false;
  for (absl::string_view part : parts) {
    int byte = 0;
    if (part.empty() || !absl::SimpleAtoi(part, &byte) || byte < 0 ||
        byte > 255) {
      return false;
    }
  }
  return true;
}

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

absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(
    const std::string& list) {
  std::vector<std::string> endpoints;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    const size_t colon = entry.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(entry.substr(colon + 1), &port) || port < 1 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint '", entry, "' is not HOST:PORT (e.g. 10.0.0.5:2379)"));
    }
    endpoints.emplace_back(entry);
  }
  return endpoints;
}

absl::StatusOr<std::unique_ptr<EtcdStorage>> EtcdStorage::Open(
    EtcdOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("no etcd endpoint given");
  }
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError("the etcd key prefix must not be empty");
  }
  std::string target;
  if (options.endpoints.size() == 1) {
    target = options.endpoints.front();
  } else {
    for (const std::string& endpoint : options.endpoints) {
      if (!IsIpv4(endpoint.substr(0, endpoint.rfind(':')))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "etcd endpoint '", endpoint,
            "': give several endpoints as IPv4 addresses (HOST:PORT with a "
            "numeric HOST), or one endpoint by name"));
      }
    }
    target = absl::StrCat("ipv4:", absl::StrJoin(options.endpoints, ","));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<EtcdStorage> storage(
      new EtcdStorage(std::move(options), std::move(channel)));
  GS_RETURN_IF_ERROR(storage->CheckFormat());
  return storage;
}

EtcdStorage::EtcdStorage(EtcdOptions options,
                         std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      data_prefix_(absl::StrCat(options_.prefix, "d/")),
      endpoints_(absl::StrJoin(options_.endpoints, ",")),
      channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> EtcdStorage::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options_.call_timeout));
  // A member that is down or restarting: wait for the channel within the
  // deadline rather than fail at once.
  context->set_wait_for_ready(true);
  return context;
}

absl::Status EtcdStorage::Failed(const char* what,
                                 const grpc::Status& status) const {
  const absl::Status s = FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat("etcd at ", endpoints_, ": ",
                                             what, ": ", s.message()));
}

absl::Status EtcdStorage::Put(absl::string_view key, absl::string_view value) {
  etcdserverpb::PutRequest request;
  request.set_key(absl::StrCat(data_prefix_, key));
  request.set_value(std::string(value));
  etcdserverpb::PutResponse response;
  grpc::Status status = kv_->Put(Context().get(), request, &response);
  if (!status.ok()) return Failed("put", status);
  return absl::OkStatus();
}

absl::StatusOr<std::string> EtcdStorage::Get(absl::string_view key) const {
  etcdserverpb::RangeRequest request;
  request.set_key(absl::StrCat(data_prefix_, key));
  etcdserverpb::RangeResponse response;
  grpc::Status status = kv_->Range(Context().get(), request, &response);
  if (!status.ok()) return Failed("get", status);
  if (response.kvs_size() == 0) {
    return absl::NotFoundError(absl::StrCat("key '", key, "' not found"));
  }
  return std::move(*response.mutable_kvs(0)->mutable_value());
}

absl::StatusOr<bool> EtcdStorage::Delete(absl::string_view key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(absl::StrCat(data_prefix_, key));
  etcdserverpb::DeleteRangeResponse response;
  grpc::Status status = kv_->DeleteRange(Context().get(), request, &response);
  if (!status.ok()) return Failed("delete", status);
  return response.deleted() > 0;
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
    grpc::Status status = kv_->Range(Context().get(), request, &response);
    if (!status.ok()) return Failed("scan", status);
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
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(begin);
  request.set_range_end(PrefixEnd(begin).value_or(std::string(1, '\0')));
  etcdserverpb::DeleteRangeResponse response;
  grpc::Status status = kv_->DeleteRange(Context().get(), request, &response);
  if (!status.ok()) return Failed("delete prefix", status);
  return response.deleted();
}

absl::Status EtcdStorage::Apply(const std::vector<Mutation>& batch) {
  std::vector<etcdserverpb::RequestOp> ops;
  std::vector<std::pair<std::string, std::string>> spans;
  for (const Mutation& m : batch) {
    std::pair<std::string, std::string> span = Span(m, data_prefix_);
    bool conflict = ops.size() >= kMaxTxnOps;
    for (size_t i = 0; !conflict && i < spans.size(); ++i) {
      conflict = Overlap(spans[i], span);
    }
    if (conflict) {
      GS_RETURN_IF_ERROR(Commit(std::move(ops)));
      ops.clear();
      spans.clear();
    }
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
  if (ops.empty()) return absl::OkStatus();
  return Commit(std::move(ops));
}

absl::Status EtcdStorage::CheckFormat() {
  const std::string marker = absl::StrCat(options_.prefix, "format");
  const std::string expected = absl::StrCat(kStateFormat);
  // Create the marker only where the namespace is empty; either way, read
  // the marker and whether any key exists, in one transaction.
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_key(options_.prefix);
  absent->set_range_end(PrefixEnd(options_.prefix).value_or(std::string(1, '\0')));
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(marker);
  put->set_value(expected);
  etcdserverpb::RangeRequest* read =
      request.add_failure()->mutable_request_range();
  read->set_key(marker);
  etcdserverpb::TxnResponse response;
  grpc::Status status = kv_->Txn(Context().get(), request, &response);
  if (!status.ok()) return Failed("reading the state format", status);
  if (response.succeeded()) return absl::OkStatus();  // a new namespace
  const etcdserverpb::RangeResponse& found =
      response.responses(0).response_range();
  if (found.kvs_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd at ", endpoints_, ": keys under '", options_.prefix,
        "' are not a gradsync state (no '", marker,
        "'): give another --etcd_prefix, or remove them if they are stale"));
  }
  if (found.kvs(0).value() != expected) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd at ", endpoints_, ": the state under '", options_.prefix,
        "' has format '", found.kvs(0).value(),
        "', this gradsync-coordinator reads format ", expected,
        ": run the gradsync that wrote it"));
  }
  return absl::OkStatus();
}

absl::Status EtcdStorage::Commit(std::vector<etcdserverpb::RequestOp> ops) {
  etcdserverpb::TxnRequest request;
  for (etcdserverpb::RequestOp& op : ops) *request.add_success() = std::move(op);
  etcdserverpb::TxnResponse response;
  grpc::Status status = kv_->Txn(Context().get(), request, &response);
  if (!status.ok()) return Failed("transaction", status);
  return absl::OkStatus();
}

}  // namespace gradsync
