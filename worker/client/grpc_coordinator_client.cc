#include "worker/client/grpc_coordinator_client.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/host_ports.h"
#include "common/keepalive.h"
#include "common/logging.h"
#include "common/job_config.h"

namespace gradsync {
namespace {

// Extra time a blocking call's deadline allows beyond the server-side wait,
// so the coordinator's precise timeout error arrives before the deadline.
constexpr absl::Duration kWaitMargin = absl::Seconds(30);

// Cancels a call when its local deadline passes (Deadline::kLocal), from a
// thread of its own that Stop() ends.
class LocalDeadline {
 public:
  LocalDeadline(grpc::ClientContext* context, absl::Time deadline)
      : thread_([this, context, deadline] {
          if (!stop_.WaitForNotificationWithDeadline(deadline)) {
            passed_ = true;
            context->TryCancel();
          }
        }) {}
  ~LocalDeadline() { Stop(); }

  // Ends the thread; returns whether the deadline passed (and the call was
  // cancelled).
  bool Stop() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (thread_.joinable()) thread_.join();
    return passed_;
  }

 private:
  absl::Notification stop_;
  bool passed_ = false;  // written by thread_ before it ends
  std::thread thread_;
};

// gRPC's words for a call the coordinator's transport ended to free memory:
// past --transport_memory_limit, gRPC's reclaimer resets streams with
// HTTP/2 ENHANCE_YOUR_CALM, which the client reports as RESOURCE_EXHAUSTED
// with this message (gRPC 1.51, chttp2 frame_rst_stream.cc). The
// coordinator's own RESOURCE_EXHAUSTED (a limit it enforces) never says it.
constexpr absl::string_view kShedByTransport =
    "Received RST_STREAM with error code 11";

bool ShedByTransport(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
         absl::StartsWith(status.error_message(), kShedByTransport);
}

// Worth another attempt: the coordinator not up yet, restarting or failing
// over (UNAVAILABLE), or a call its transport shed to free memory.
bool Transient(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         ShedByTransport(status);
}

// The wait a join allows: `max_wait`, or the job's join timeout (the
// default one when unset) plus kWaitMargin.
absl::Duration JoinWait(const v1::JobConfig& config, absl::Duration max_wait) {
  if (max_wait > absl::ZeroDuration()) return max_wait;
  const absl::Duration join_timeout = FromProtoDuration(config.join_timeout());
  return (join_timeout > absl::ZeroDuration() ? join_timeout
                                              : kDefaultJoinTimeout) +
         kWaitMargin;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorClient>> GrpcCoordinatorClient::Create(
    ClientOptions options) {
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseHostPorts(options.target, "coordinator address", "127.0.0.1:29400");
  if (!addresses.ok()) return addresses.status();
  absl::StatusOr<std::string> target =
      FailoverTarget(*addresses, "coordinator address");
  if (!target.ok()) return target.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Reconnect quickly while the coordinator starts or restarts: a restarted
  // coordinator finds members silent after a grace of a few seconds, so the
  // channel retries at least every second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A coordinator that stops answering without closing its connections (a
  // frozen process, a partition) is found by keepalive pings
  // (common/keepalive.h); the channel then reconnects, to the next replica
  // when this one does not complete a connection in time.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              absl::ToInt64Milliseconds(kKeepaliveTime));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              absl::ToInt64Milliseconds(kKeepaliveTimeout));
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // long waits too
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              absl::ToInt64Milliseconds(kConnectTimeout));
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<CoordinatorClient>(
      new GrpcCoordinatorClient(std::move(options), std::move(args),
                            *std::move(credentials), *std::move(target)));
}

GrpcCoordinatorClient::Route::Route(
    std::string target_in, bool to_leader_in,
    const grpc::ChannelArguments& args,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials)
    : target(std::move(target_in)),
      to_leader(to_leader_in),
      channel(grpc::CreateCustomChannel(
          target,
          credentials != nullptr ? credentials
                                 : grpc::InsecureChannelCredentials(),
          args)),
      rendezvous(v1::Rendezvous::NewStub(channel)),
      kv(v1::KeyValue::NewStub(channel)),
      jobs(v1::Jobs::NewStub(channel)),
      monitor(v1::Monitor::NewStub(channel)),
      tokens(v1::Tokens::NewStub(channel)) {}

GrpcCoordinatorClient::GrpcCoordinatorClient(
    ClientOptions options, grpc::ChannelArguments args,
    std::shared_ptr<grpc::ChannelCredentials> credentials, std::string target)
    : options_(std::move(options)),
      authorization_(options_.token.empty()
                         ? ""
                         : absl::StrCat("Bearer ", options_.token)),
      args_(std::move(args)),
      credentials_(std::move(credentials)),
      replicas_(std::make_shared<const Route>(std::move(target),
                                              /*to_leader=*/false, args_,
                                              credentials_)),
      route_(replicas_) {}

void GrpcCoordinatorClient::Authorize(grpc::ClientContext* context) const {
  if (!authorization_.empty()) {
    context->AddMetadata("authorization", authorization_);
  }
}

std::string GrpcCoordinatorClient::UnreachableHint() const {
  return options_.tls.ca.empty()
             ? " (is it running, and is the address right? A coordinator "
               "serving TLS closes plaintext connections: give --tls_ca)"
             : " (is it running, and is the address right? Over TLS: does "
               "--tls_ca hold the CA of the coordinator's certificate, and "
               "does a coordinator with --tls_client_ca get a client "
               "certificate it trusts, --tls_cert and --tls_key?)";
}

absl::Status GrpcCoordinatorClient::GaveUp(const char* what,
                                           const grpc::Status& last,
                                           int attempts,
                                           absl::Duration spent) const {
  const std::string tried = absl::StrCat(
      " after ", attempts, " attempt(s) in ",
      absl::FormatDuration(absl::Trunc(spent, absl::Milliseconds(1))), ": ",
      last.error_message());
  if (ShedByTransport(last)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": the coordinator at ", options_.target,
        " kept ending the call to free memory", tried,
        " (it is short of memory for its connections: see its "
        "--transport_memory_limit)"));
  }
  return absl::UnavailableError(absl::StrCat(
      what, ": cannot reach the coordinator at ", options_.target, tried,
      UnreachableHint()));
}

std::shared_ptr<const GrpcCoordinatorClient::Route> GrpcCoordinatorClient::route()
    const {
  absl::MutexLock lock(&mu_);
  return route_;
}

bool GrpcCoordinatorClient::Reroute(const grpc::ClientContext& context,
                                const grpc::Status& status, const Route& used) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto named = trailers.find(kLeaderMetadataKey);
  std::string leader;
  if (named != trailers.end()) {
    leader.assign(named->second.data(), named->second.size());
  }
  absl::StatusOr<std::string> target = absl::InvalidArgumentError("none");
  if (!leader.empty()) {
    absl::StatusOr<std::vector<std::string>> address =
        ParseHostPorts(leader, "leader address", "10.0.0.5:29400");
    if (address.ok() && address->size() == 1) {
      target = FailoverTarget(*address, "leader address");
    }
  }
  absl::MutexLock lock(&mu_);
  if (route_.get() != &used) return true;  // another call moved already
  if (target.ok() && *target != used.target) {
    if (leader != last_leader_) {
      GS_LOG(INFO) << "a coordinator replica stands by: following the "
                   << "leader it names at " << leader;
      last_leader_ = leader;
    }
    route_ = std::make_shared<const Route>(*target, /*to_leader=*/true, args_,
                                           credentials_);
    return true;
  }
  if (used.to_leader && !target.ok()) {
    if (used.target != last_unreachable_) {
      GS_LOG(INFO) << "the leader at " << used.target << " is unreachable ("
                   << status.error_message() << "): trying the replicas "
                   << options_.target;
      last_unreachable_ = used.target;
    }
    route_ = replicas_;
  }
  return false;
}

void GrpcCoordinatorClient::TellTerm(const char* what,
                                     const grpc::ClientContext& context) const {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto stamped = trailers.find(kTermMetadataKey);
  if (stamped == trailers.end()) return;
  std::optional<TermStamp> stamp = ParseTermStamp(
      absl::string_view(stamped->second.data(), stamped->second.size()));
  if (stamp.has_value()) options_.on_term(what, *stamp);
}

absl::Status GrpcCoordinatorClient::Call(const char* what, absl::Duration timeout,
                                     const Attempt& attempt,
                                     Deadline deadline) {
  const RetryPolicy& retry = options_.retry;
  const absl::Time start = absl::Now();
  absl::Duration backoff = retry.initial_backoff;
  absl::BitGen random;
  for (int attempt_number = 1;; ++attempt_number) {
    grpc::ClientContext context;
    std::optional<LocalDeadline> local;
    if (deadline == Deadline::kSent) {
      context.set_deadline(std::chrono::system_clock::now() +
                           absl::ToChronoMilliseconds(timeout));
    } else {
      local.emplace(&context, absl::Now() + timeout);
    }
    Authorize(&context);
    const std::shared_ptr<const Route> route = this->route();
    grpc::Status status = attempt(&context, *route);
    if (local.has_value() && local->Stop()) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": no answer from the coordinator at ", options_.target,
          " within ", absl::FormatDuration(timeout)));
    }
    if (status.ok() && options_.on_term) TellTerm(what, context);
    if (!Transient(status)) return FromGrpcStatus(status);
    const bool moved = status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                       Reroute(context, status, *route);
    if (moved && attempt_number < retry.max_attempts &&
        absl::Now() - start < retry.budget) {
      continue;  // to the leader, at once
    }
    absl::Duration pause =
        backoff * absl::Uniform(random, 1.0 - retry.jitter, 1.0 + retry.jitter);
    if (attempt_number >= retry.max_attempts ||
        absl::Now() + pause - start > retry.budget) {
      return GaveUp(what, status, attempt_number, absl::Now() - start);
    }
    absl::SleepFor(pause);
    backoff = std::min(retry.max_backoff, backoff * retry.backoff_multiplier);
  }
}

absl::StatusOr<v1::Assignment> GrpcCoordinatorClient::Join(
    const v1::JoinRequest& request, absl::Duration max_wait) {
  v1::JoinResponse response;
  absl::Status status = Call(
      "join", JoinWait(request.config(), max_wait),
      [&](grpc::ClientContext* context, const Route& r) {
        // Wait for the connection rather than failing fast while the
        // coordinator starts.
        context->set_wait_for_ready(true);
        return r.rendezvous->Join(context, request, &response);
      },
      Deadline::kLocal);
  if (!status.ok()) return status;
  return response.assignment();
}

absl::StatusOr<std::vector<v1::Assignment>> GrpcCoordinatorClient::JoinNode(
    const v1::JoinNodeRequest& request, absl::Duration max_wait) {
  v1::JoinNodeResponse response;
  absl::Status status = Call(
      "join", JoinWait(request.config(), max_wait),
      [&](grpc::ClientContext* context, const Route& r) {
        context->set_wait_for_ready(true);
        return r.rendezvous->JoinNode(context, request, &response);
      },
      Deadline::kLocal);
  if (!status.ok()) return status;
  if (response.assignments_size() != request.processes_size()) {
    return absl::InternalError(absl::StrCat(
        "join: the coordinator answered ", response.assignments_size(),
        " assignments for ", request.processes_size(), " processes"));
  }
  return std::vector<v1::Assignment>(response.assignments().begin(),
                                     response.assignments().end());
}

absl::Status GrpcCoordinatorClient::Leave(const std::string& job_id,
                                      const std::string& incarnation_id) {
  v1::LeaveRequest request;
  request.set_job_id(job_id);
  request.set_incarnation_id(incarnation_id);
  v1::LeaveResponse response;
  return Call("leave", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
    return r.rendezvous->Leave(c, request, &response);
  });
}

absl::Status GrpcCoordinatorClient::Set(const v1::Scope& scope,
                                    const std::string& key,
                                    const std::string& value) {
  v1::SetRequest request;
  *request.mutable_scope() = scope;
  request.set_key(key);
  request.set_value(value);
  v1::SetResponse response;
  return Call("set", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
    return r.kv->Set(c, request, &response);
  });
}

absl::StatusOr<std::string> GrpcCoordinatorClient::Get(const v1::Scope& scope,
                                                   const std::string& key) {
  v1::GetRequest request;
  *request.mutable_scope() = scope;
  request.set_key(key);
  v1::GetResponse response;
  absl::Status status =
      Call("get", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.kv->Get(c, request, &response);
      });
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> GrpcCoordinatorClient::Add(const v1::Scope& scope,
                                               const std::string& key,
                                               int64_t delta) {
  v1::AddRequest request;
  *request.mutable_scope() = scope;
  request.set_key(key);
  request.set_delta(delta);
  request.set_request_id(NewRandomId());  // every attempt sends the same
  v1::AddResponse response;
  absl::Status status =
      Call("add", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.kv->Add(c, request, &response);
      });
  if (!status.ok()) return status;
  return response.value();
}

absl::StatusOr<v1::CompareAndSetResponse> GrpcCoordinatorClient::CompareAndSet(
    const v1::CompareAndSetRequest& asked) {
  v1::CompareAndSetRequest request = asked;
  if (request.request_id().empty()) request.set_request_id(NewRandomId());
  v1::CompareAndSetResponse response;
  absl::Status status = Call(
      "compare-and-set", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.kv->CompareAndSet(c, request, &response);
      });
  if (!status.ok()) return status;
  return response;
}

absl::Status GrpcCoordinatorClient::Wait(const v1::Scope& scope,
                                     const std::vector<std::string>& keys,
                                     absl::Duration timeout) {
  v1::WaitRequest request;
  *request.mutable_scope() = scope;
  for (const std::string& key : keys) request.add_keys(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::WaitResponse response;
  return Call("wait", timeout + kWaitMargin, [&](grpc::ClientContext* c, const Route& r) {
    return r.kv->Wait(c, request, &response);
  });
}

absl::StatusOr<bool> GrpcCoordinatorClient::Delete(const v1::Scope& scope,
                                               const std::string& key) {
  v1::DeleteRequest request;
  *request.mutable_scope() = scope;
  request.set_key(key);
  v1::DeleteResponse response;
  absl::Status status =
      Call("delete", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.kv->Delete(c, request, &response);
      });
  if (!status.ok()) return status;
  return response.existed();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
GrpcCoordinatorClient::List(const v1::Scope& scope, const std::string& prefix,
                        bool keys_only) {
  v1::ListRequest request;
  *request.mutable_scope() = scope;
  request.set_prefix(prefix);
  request.set_keys_only(keys_only);
  v1::ListResponse response;
  absl::Status status =
      Call("list", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.kv->List(c, request, &response);
      });
  if (!status.ok()) return status;
  std::vector<std::pair<std::string, std::string>> entries;
  for (v1::ListResponse::Entry& e : *response.mutable_entries()) {
    entries.emplace_back(std::move(*e.mutable_key()),
                         std::move(*e.mutable_value()));
  }
  return entries;
}

absl::StatusOr<v1::CreateJobResponse> GrpcCoordinatorClient::CreateJob(
    const v1::JobConfig& config) {
  v1::CreateJobRequest request;
  *request.mutable_config() = config;
  v1::CreateJobResponse response;
  absl::Status status =
      Call("create job", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.jobs->CreateJob(c, request, &response);
      });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<std::string> GrpcCoordinatorClient::RotateToken(
    const std::string& job_id) {
  v1::RotateTokenRequest request;
  request.set_job_id(job_id);
  v1::RotateTokenResponse response;
  absl::Status status = Call(
      "rotate token", options_.call_timeout,
      [&](grpc::ClientContext* c, const Route& r) {
        return r.tokens->RotateToken(c, request, &response);
      });
  if (!status.ok()) return status;
  return std::move(*response.mutable_token());
}

absl::Status GrpcCoordinatorClient::RevokeToken(const std::string& job_id) {
  v1::RevokeTokenRequest request;
  request.set_job_id(job_id);
  v1::RevokeTokenResponse response;
  return Call("revoke token", options_.call_timeout,
              [&](grpc::ClientContext* c, const Route& r) {
                return r.tokens->RevokeToken(c, request, &response);
              });
}

absl::StatusOr<v1::JobStatus> GrpcCoordinatorClient::GetJob(
    const std::string& job_id, bool with_buckets) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_with_buckets(with_buckets);
  absl::StatusOr<v1::GetJobResponse> response = QueryJob(request);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_job());
}

absl::StatusOr<v1::GetJobResponse> GrpcCoordinatorClient::QueryJob(
    const v1::GetJobRequest& request) {
  v1::GetJobResponse response;
  absl::Status status =
      Call("get job", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.jobs->GetJob(c, request, &response);
      });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<std::vector<v1::JobStatus>> GrpcCoordinatorClient::ListJobs() {
  v1::ListJobsRequest request;
  v1::ListJobsResponse response;
  absl::Status status =
      Call("list jobs", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.jobs->ListJobs(c, request, &response);
      });
  if (!status.ok()) return status;
  return std::vector<v1::JobStatus>(response.jobs().begin(),
                                    response.jobs().end());
}

absl::Status GrpcCoordinatorClient::WatchJob(
    const std::string& job_id, absl::Duration min_interval, bool with_buckets,
    const std::function<bool(const v1::JobStatus&)>& on_status,
    const v1::MemberQuery& members) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  *request.mutable_members() = members;
  request.set_with_buckets(with_buckets);
  request.set_min_interval_ms(absl::ToInt64Milliseconds(min_interval));
  grpc::ClientContext context;
  Authorize(&context);
  const std::shared_ptr<const Route> route = this->route();
  std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>> reader =
      route->jobs->WatchJob(&context, request);
  v1::WatchJobResponse response;
  v1::JobStatus job;
  while (reader->Read(&response)) {
    ApplyWatchResponse(std::move(response), &job);
    if (!on_status(job)) {
      context.TryCancel();
      reader->Finish().IgnoreError();
      return absl::CancelledError("the watch was stopped by its caller");
    }
  }
  grpc::Status status = reader->Finish();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    Reroute(context, status, *route);  // for the next watch
    return absl::UnavailableError(absl::StrCat(
        "watch: cannot reach the coordinator at ", options_.target, ": ",
        status.error_message(), UnreachableHint()));
  }
  return FromGrpcStatus(status);
}

absl::StatusOr<v1::JobState> GrpcCoordinatorClient::ReportCompletion(
    const v1::ReportCompletionRequest& request) {
  v1::ReportCompletionResponse response;
  absl::Status status = Call(
      "report completion", options_.call_timeout, [&](grpc::ClientContext* c, const Route& r) {
        return r.monitor->ReportCompletion(c, request, &response);
      });
  if (!status.ok()) return status;
  return response.job_state();
}

}  // namespace gradsync
