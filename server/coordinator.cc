#include "server/coordinator.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/keepalive.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/malformed_request.h"
#include "server/http/prometheus_metrics.h"
#include "server/http/status_page.h"
#include "server/storage/in_memory_storage.h"

namespace gradsync {

namespace {

// The health settings, the shedder told of a heartbeat rate cap (at the
// cap, heartbeats are the load however few they are), and of the queues.
HealthConfig HealthSettings(const CoordinatorConfig& config) {
  HealthConfig health = config.health;
  health.completion_queues = config.completion_queues;
  if (config.max_heartbeat_rate > 0) {
    health.shedding.min_rate =
        std::min(health.shedding.min_rate, config.max_heartbeat_rate);
  }
  return health;
}

}  // namespace

Coordinator::Coordinator(CoordinatorConfig config)
    : config_(std::move(config)),
      clock_(config_.clock != nullptr ? config_.clock : RealClock::Get()),
      owned_storage_(config_.storage != nullptr
                         ? nullptr
                         : std::make_unique<InMemoryStorage>()),
      storage_(config_.storage != nullptr ? config_.storage
                                          : owned_storage_.get()),
      auth_(storage_, config_.admin_token),
      jobs_(storage_, clock_, config_.job_limits),
      kv_(storage_, clock_, &jobs_, config_.kv_limits),
      // The round's store and its monitoring follow the rendezvous's round
      // events, in this order (round_lifecycle.h: the store is open before
      // any assignment leaves).
      rendezvous_(&jobs_, clock_, {&kv_, &health_}),
      // A lost member re-forms its round (failure policy RECOVER).
      health_(&jobs_, clock_, HealthSettings(config_),
              [this](const HealthManager::Loss& loss) {
                rendezvous_.MemberLost(loss.job_id, loss.round, loss.rank,
                                       loss.reason, loss.detection);
              },
              // Spares of an ended job stop waiting.
              [this](const std::string& job_id, v1::JobState state,
                     const std::string& reason) {
                rendezvous_.JobEnded(job_id, state, reason);
              },
              // A round whose replicas diverged re-forms from the majority.
              [this](const HealthManager::Heal& heal) {
                rendezvous_.HealDivergence(heal.job_id, heal.round, heal.ranks,
                                           heal.reason);
              },
              // A straggler's micro-batches move in a planned re-form.
              [this](const HealthManager::Rebalance& r) {
                rendezvous_.Rebalance(r.job_id, r.round, r.shares, r.reason);
              }),
      stream_limits_(config_.max_streams_per_connection),
      rendezvous_service_(&rendezvous_, &auth_),
      kv_service_(&kv_, &auth_, config_.leader_term),
      jobs_service_(&jobs_, &rendezvous_, &health_, clock_, &auth_,
                    &stream_limits_),
      tokens_service_(&jobs_, &auth_),
      health_service_(&health_, &auth_, &stream_limits_,
                      config_.max_heartbeat_rate, config_.police_heartbeats),
      metrics_(HttpRoutes()) {}

std::vector<HttpRoute> Coordinator::HttpRoutes() {
  google::protobuf::util::JsonPrintOptions json;
  json.preserve_proto_field_names = true;
  json.always_print_primitive_fields = true;
  const auto to_json =
      [json](const google::protobuf::Message& message) -> absl::StatusOr<std::string> {
    std::string out;
    const auto printed =
        google::protobuf::util::MessageToJsonString(message, &out, json);
    if (!printed.ok()) {
      return absl::InternalError(std::string(printed.message()));
    }
    return out;
  };
  return {
      // Prometheus scrapes: the admin's (a scraper sends the admin token
      // when the coordinator has tokens).
      {"/metrics", "text/plain; version=0.0.4; charset=utf-8",
       [this](const HttpRequest& request) -> absl::StatusOr<std::string> {
         GS_ASSIGN_OR_RETURN(Caller caller, auth_.Identify(request.authorization));
         GS_RETURN_IF_ERROR(Authenticator::Authorize(caller, ""));
         return RenderMetrics();
       }},
      // The page holds no data: it asks the API below, with the token the
      // person gave it.
      {"/", "text/html; charset=utf-8",
       [](const HttpRequest&) -> absl::StatusOr<std::string> {
         return std::string(kStatusPageHtml);
       }},
      {"/api/jobs", "application/json",
       [this, to_json](const HttpRequest& request) -> absl::StatusOr<std::string> {
         GS_ASSIGN_OR_RETURN(Caller caller, auth_.Identify(request.authorization));
         v1::ListJobsResponse jobs;
         for (v1::JobStatus& job : jobs_.List()) {
           if (Authenticator::Authorize(caller, job.config().job_id()).ok()) {
             *jobs.add_jobs() = std::move(job);
           }
         }
         return to_json(jobs);
       }},
      {"/api/job", "application/json",
       [this, to_json](const HttpRequest& request) -> absl::StatusOr<std::string> {
         auto id = request.params.find("id");
         if (id == request.params.end()) {
           return absl::InvalidArgumentError("/api/job needs ?id=JOB");
         }
         GS_ASSIGN_OR_RETURN(Caller caller, auth_.Identify(request.authorization));
         GS_RETURN_IF_ERROR(Authenticator::Authorize(caller, id->second));
         GS_ASSIGN_OR_RETURN(v1::MemberQuery query,
                             StatusPageQuery(id->second, request.params));
         v1::JobStatus job;
         GS_RETURN_IF_ERROR(
             jobs_service_.JobStatus(id->second, false, &job, query));
         return to_json(job);
       }},
  };
}

absl::StatusOr<v1::MemberQuery> Coordinator::StatusPageQuery(
    const std::string& job_id,
    const std::map<std::string, std::string>& params) const {
  auto param = [&](const char* name) {
    auto it = params.find(name);
    return it == params.end() ? std::string() : it->second;
  };
  const std::string members = param("members");
  v1::MemberQuery query;
  if (members == "none") {
    query.set_none(true);
    return query;
  }
  if (members == "unhealthy") {
    query.set_unhealthy_only(true);
  } else if (members.empty() || members == "auto") {
    v1::MemberQuery none;
    none.set_none(true);
    v1::JobStatus summary;
    GS_RETURN_IF_ERROR(jobs_service_.JobStatus(job_id, false, &summary, none));
    query.set_unhealthy_only(summary.world_size() > kStatusPageAllUpTo);
  } else if (members != "all") {
    return absl::InvalidArgumentError(absl::StrCat(
        "members='", members, "': use all, unhealthy, none or auto"));
  }
  // Optional counts: from, to (the rank range) and limit (the page size).
  auto count = [&](const char* name, auto set) -> absl::Status {
    const std::string text = param(name);
    int value = 0;
    if (text.empty()) return absl::OkStatus();
    if (!absl::SimpleAtoi(text, &value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "='", text, "' is not a count"));
    }
    (query.*set)(value);
    return absl::OkStatus();
  };
  GS_RETURN_IF_ERROR(count("from", &v1::MemberQuery::set_rank_from));
  GS_RETURN_IF_ERROR(count("to", &v1::MemberQuery::set_rank_to));
  GS_RETURN_IF_ERROR(count("limit", &v1::MemberQuery::set_page_size));
  if (query.unhealthy_only() && query.page_size() == 0) {
    query.set_page_size(kStatusPageListed);
  }
  return query;
}

Coordinator::~Coordinator() { Shutdown(); }

absl::Status Coordinator::Start() {
  absl::Status loaded = RestoreFromStorage();
  if (!loaded.ok()) return loaded;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  // First, so the statistics count the status it gives.
  interceptors.push_back(NewMalformedRequestInterceptorFactory());
  interceptors.push_back(rpc_stats_.NewInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.AddListeningPort(config_.listen_address,
                           config_.credentials != nullptr
                               ? config_.credentials
                               : grpc::InsecureServerCredentials(),
                           &port_);
  // Values are up to 1 MiB; leave room for the rest of the message.
  builder.SetMaxReceiveMessageSize(8 << 20);
  // Clients' keepalive pings are welcome, however rarely this server sends
  // them data.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             absl::ToInt64Milliseconds(kMinPingInterval));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (!config_.grow_receive_windows) {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  }
  if (config_.transport_memory_limit > 0) {
    grpc::ResourceQuota quota("gradsync-coordinator-transport");
    quota.Resize(static_cast<size_t>(config_.transport_memory_limit));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(&rendezvous_service_);
  builder.RegisterService(&kv_service_);
  builder.RegisterService(&jobs_service_);
  builder.RegisterService(&tokens_service_);
  builder.RegisterService(&health_service_);
  queues_.AddTo(&builder, config_.completion_queues);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", config_.listen_address,
        "': the address is in use or not local (use HOST:PORT)"));
  }
  if (!config_.metrics_listen_address.empty()) {
    absl::Status metrics =
        metrics_.Start(config_.metrics_listen_address, config_.http_tls_cert,
                       config_.http_tls_key);
    if (!metrics.ok()) {
      server_->Shutdown();
      queues_.Shutdown();
      server_.reset();
      return metrics;
    }
    GS_LOG(INFO) << "serving Prometheus metrics on http://"
                 << config_.metrics_listen_address << "/metrics (port "
                 << metrics_.port() << ")";
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  // Members of rounds restored from storage get one detection window from
  // now, as the server serves, to heartbeat again.
  health_.MonitorRunningRounds();
  health_service_.Start(&queues_);
  rendezvous_service_.Start(queues_);
  queues_.Start();
  poller_ = std::thread([this] { PollLoop(); });
  GS_LOG(INFO) << "gradsync coordinator serving gradsync.v1 on "
               << config_.listen_address << " (port " << port_ << ")";
  return absl::OkStatus();
}

void Coordinator::Shutdown() {
  if (server_ == nullptr || shut_down_.HasBeenNotified()) return;
  GS_LOG(INFO) << "coordinator shutting down";
  server_->GetHealthCheckService()->SetServingStatus(false);
  // Shutdown cancels every heartbeat stream: that is not the workers' death.
  health_.StopDetection();
  metrics_.Stop();
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(config_.shutdown_grace));
  queues_.Shutdown();
  stop_polling_.Notify();
  if (poller_.joinable()) poller_.join();
  shut_down_.Notify();
}

absl::Status Coordinator::RestoreFromStorage() {
  GS_RETURN_IF_ERROR(auth_.LoadFromStorage());
  GS_RETURN_IF_ERROR(jobs_.LoadFromStorage());
  // Tokens of jobs forgotten before tokens went with their jobs.
  for (const std::string& job_id : auth_.JobsWithTokens()) {
    if (!jobs_.Exists(job_id)) GS_RETURN_IF_ERROR(auth_.Forget(job_id));
  }
  // Keys and records of jobs forgotten before they went with their jobs.
  GS_ASSIGN_OR_RETURN(
      const int dropped,
      kv_.DropForgottenJobs([this](const std::string& job_id) {
        return jobs_.Exists(job_id);
      }));
  if (dropped > 0) {
    GS_LOG(INFO) << "deleted the stored keys of " << dropped
                 << " forgotten job(s)";
  }
  for (const v1::JobStatus& job : jobs_.List()) {
    if (job.round() < 1) continue;
    // A WAITING job with a round had that round superseded: it stays
    // retired. Every other closed round accepts key-value calls again.
    const bool open = job.state() != v1::JOB_STATE_WAITING;
    GS_RETURN_IF_ERROR(kv_.RestoreRound(job.config().job_id(), job.round(), open));
  }
  return rendezvous_.Restore();
}

void Coordinator::Wait() { shut_down_.WaitForNotification(); }

std::string Coordinator::RenderMetrics() const {
  return gradsync::RenderMetrics(jobs_, rendezvous_, health_, rpc_stats_);
}

void Coordinator::ReportQueueDelays() {
  const absl::Time now = absl::Now();
  // Under a rate cap each job's heartbeats also wait for their turns.
  HeartbeatPacer::Waits waits = health_service_.TurnWaits(now);
  const std::vector<absl::Duration> delays = queues_.Delays(now);
  absl::Duration overall = waits.longest;
  for (absl::Duration delay : delays) overall = std::max(overall, delay);
  health_.ReportQueueDelay(overall, delays, std::move(waits.jobs));
}

void Coordinator::PollLoop() {
  bool saving_failed = false;  // logged once per run of failures
  const auto save_round_starts = [&] {
    const absl::Status saved = jobs_.SaveRoundStarts();
    if (!saved.ok() && !saving_failed) {
      GS_LOG(WARNING) << saved << " (tried again every poll)";
    }
    saving_failed = !saved.ok();
  };
  while (!stop_polling_.WaitForNotificationWithTimeout(config_.poll_interval)) {
    rendezvous_.Poll();
    kv_.Poll();
    ReportQueueDelays();
    health_.Poll();
    jobs_service_.PollWatches();
    save_round_starts();
    // The job record goes last (JobManager::ForgetIfEndedBefore says why).
    const absl::Time cutoff = clock_->Now() - config_.retention;
    for (const std::string& job_id : jobs_.EndedBefore(cutoff)) {
      // Tells the round's store and monitoring too (RoundEvent::kForgotten).
      rendezvous_.ForgetJob(job_id);
      absl::Status token_gone = auth_.Forget(job_id);
      if (!token_gone.ok()) {
        // Kept, retried at the next poll: the token must not outlive it.
        GS_LOG(WARNING) << "job '" << job_id
                        << "': could not remove its token: " << token_gone;
        continue;
      }
      if (jobs_.ForgetIfEndedBefore(job_id, cutoff)) {
        GS_LOG(INFO) << "job '" << job_id << "' forgotten: it ended more than "
                     << absl::FormatDuration(config_.retention) << " ago";
      }
    }
  }
  save_round_starts();  // what the last polls left, before the stop
}

}  // namespace gradsync
