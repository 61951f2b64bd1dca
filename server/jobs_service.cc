#include "server/jobs_service.h"

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/job_config.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// The shortest interval between two statuses of one watch.
constexpr absl::Duration kMinWatchInterval = absl::Milliseconds(100);

// The members a query selects, but for its health filter (see JobStatus).
absl::StatusOr<JobManager::MemberSelection> SelectionFor(
    const v1::MemberQuery& query) {
  if (query.rank_from() < 0 || query.rank_to() < 0 ||
      (query.rank_to() > 0 && query.rank_to() <= query.rank_from())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "members: rank range [", query.rank_from(), ", ", query.rank_to(),
        ") is empty or negative (rank_to 0 means through the last rank)"));
  }
  if (query.page_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "members: page_size must be >= 0, got ", query.page_size()));
  }
  JobManager::MemberSelection selection;
  selection.rank_from = query.rank_from();
  selection.rank_to = query.rank_to();
  selection.limit = query.page_size();
  if (!query.page_token().empty()) {
    int next = 0;
    if (!absl::SimpleAtoi(query.page_token(), &next) ||
        next < query.rank_from() ||
        (query.rank_to() > 0 && next >= query.rank_to())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "members: page_token '", query.page_token(),
          "' does not continue this query (pass next_page_token unchanged, "
          "with the same query)"));
    }
    selection.page_start = next;
  }
  return selection;
}

}  // namespace

// One WatchJob stream. MaybeSend() writes the job's status when it changed
// (one write at a time): whole at first, then as deltas; the stream
// finishes after a terminal status, when the job is gone, when it was not
// allowed, or when the client cancels. Lifetime: owned by the
// service's watch set; deleted by PollWatches (or the service's destructor)
// once gRPC called OnDone.
class JobsService::Watch final
    : public grpc::ServerWriteReactor<v1::WatchJobResponse> {
 public:
  Watch(const JobsService* service, std::string job_id,
        absl::Duration min_interval, bool with_buckets, v1::MemberQuery query)
      : service_(service),
        job_id_(std::move(job_id)),
        min_interval_(min_interval),
        with_buckets_(with_buckets),
        query_(std::move(query)) {}

  bool released() const { return released_.load(); }

  // Its place among its connection's streams (WatchAllowed fills it).
  ConnectionLimits::Lease* lease() { return &lease_; }
  // Whether the watch may go on: when not, it ends with `allowed` at its
  // first MaybeSend(). Called once, before MaybeSend().
  void Allow(absl::Status allowed) {
    absl::MutexLock lock(&mu_);
    refused_ = std::move(allowed);
  }

  void MaybeSend(absl::Time now) {
    absl::MutexLock lock(&mu_);
    if (finishing_ || writing_ || cancelled_ || now < next_send_) return;
    v1::JobStatus status;
    absl::Status read =
        refused_.ok()
            ? service_->JobStatus(job_id_, with_buckets_, &status, query_)
            : refused_;
    if (!read.ok()) {
      finishing_ = true;
      Finish(ToGrpcStatus(read));
      return;
    }
    if (!NextResponseLocked(&status)) return;  // nothing changed
    final_ = IsTerminal(response_.job().state());
    writing_ = true;
    next_send_ = now + min_interval_;
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (finishing_) return;
    if (cancelled_) {
      // A write in flight at the cancel may still complete OK: the stream
      // must end here all the same, or the server's shutdown waits for it.
      finishing_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    } else if (!ok || final_) {
      finishing_ = true;
      Finish(ok ? grpc::Status::OK
                : grpc::Status(grpc::StatusCode::CANCELLED, "watch ended"));
    }
  }

  // Fills response_ with what the client needs to know of `status` after
  // what it was sent: the whole status first and after a round change, then
  // deltas (the members that changed by rank, the ranks that left the
  // selection). False when nothing changed.
  bool NextResponseLocked(v1::JobStatus* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    google::protobuf::RepeatedPtrField<v1::Member> members;
    members.Swap(status->mutable_members());
    std::string header = status->SerializeAsString();
    absl::flat_hash_map<int, std::string> by_rank;
    response_.Clear();
    const bool whole = !sent_any_ || status->round() != last_round_;
    for (v1::Member& m : members) {
      const int rank = m.rank();
      std::string bytes = m.SerializeAsString();
      auto last = last_members_.find(rank);
      if (whole || last == last_members_.end() || last->second != bytes) {
        *response_.mutable_job()->add_members() = std::move(m);
      }
      by_rank[rank] = std::move(bytes);
    }
    if (!whole) {
      for (const auto& [rank, bytes] : last_members_) {
        if (!by_rank.contains(rank)) response_.add_removed_ranks(rank);
      }
      if (header == last_header_ && response_.job().members_size() == 0 &&
          response_.removed_ranks_size() == 0) {
        return false;
      }
    }
    google::protobuf::RepeatedPtrField<v1::Member> changed;
    changed.Swap(response_.mutable_job()->mutable_members());
    response_.mutable_job()->Swap(status);
    response_.mutable_job()->mutable_members()->Swap(&changed);
    response_.set_delta(!whole);
    sent_any_ = true;
    last_round_ = response_.job().round();
    last_header_ = std::move(header);
    last_members_ = std::move(by_rank);
    return true;
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (finishing_ || writing_) return;  // the write's OnWriteDone finishes
    finishing_ = true;
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  void OnDone() override { released_.store(true); }

 private:
  const JobsService* const service_;
  const std::string job_id_;
  const absl::Duration min_interval_;
  const bool with_buckets_;
  const v1::MemberQuery query_;
  ConnectionLimits::Lease lease_;
  std::atomic<bool> released_{false};

  absl::Mutex mu_;
  // Not OK when the watch may not go on (see Allow).
  absl::Status refused_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // OnCancel ran
  bool final_ ABSL_GUARDED_BY(mu_) = false;  // the status in flight is terminal
  absl::Time next_send_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // What the client was sent: the status but its members, the round, and
  // each member serialized, by rank.
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_header_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::string> last_members_ ABSL_GUARDED_BY(mu_);
  v1::WatchJobResponse response_ ABSL_GUARDED_BY(mu_);
};

grpc::MessageHolder<v1::GetJobRequest, v1::GetJobResponse>*
JobsService::ArenaAllocator::AllocateMessages() {
  class Holder final
      : public grpc::MessageHolder<v1::GetJobRequest, v1::GetJobResponse> {
   public:
    Holder() {
      set_request(
          google::protobuf::Arena::CreateMessage<v1::GetJobRequest>(&arena_));
      set_response(
          google::protobuf::Arena::CreateMessage<v1::GetJobResponse>(&arena_));
    }
    void Release() override { delete this; }

   private:
    google::protobuf::Arena arena_;
  };
  return new Holder();
}

JobsService::JobsService(JobManager* jobs, const RendezvousManager* rendezvous,
                         const HealthManager* health, Clock* clock,
                         Authenticator* auth, ConnectionLimits* limits)
    : jobs_(jobs),
      rendezvous_(rendezvous),
      health_(health),
      clock_(clock),
      auth_(auth),
      limits_(limits) {
  SetMessageAllocatorFor_GetJob(&get_job_allocator_);
}

JobsService::~JobsService() {
  // The server is shut down: every watch has had its OnDone.
  absl::MutexLock lock(&mu_);
  for (Watch* watch : watches_) delete watch;
}

absl::Status JobsService::JobStatus(const std::string& job_id,
                                    bool with_buckets, v1::JobStatus* out,
                                    const v1::MemberQuery& query,
                                    std::string* next_page_token) const {
  GS_RETURN_IF_ERROR(ValidateJobId(job_id));
  GS_ASSIGN_OR_RETURN(JobManager::MemberSelection selection,
                      SelectionFor(query));
  absl::flat_hash_set<int> stragglers;
  int64_t stragglers_round = 0;
  if (query.unhealthy_only()) {
    auto [round, ranks] = health_->StragglerRanks(job_id);
    stragglers_round = round;
    stragglers.insert(ranks.begin(), ranks.end());
    selection.keep = [&](const v1::Member& m) {
      return m.state() != v1::MEMBER_STATE_ACTIVE ||
             (out->round() == stragglers_round && stragglers.contains(m.rank()));
    };
  }
  if (query.none()) selection.keep = [](const v1::Member&) { return false; };
  GS_ASSIGN_OR_RETURN(JobManager::SelectionCounts counts,
                      jobs_->CopySelected(job_id, selection, out));
  rendezvous_->DescribeWaiting(job_id, out);
  health_->Describe(out, with_buckets);
  health_->Summarize(out);
  v1::JobSummary* summary = out->mutable_summary();
  summary->set_active(counts.active);
  summary->set_lost(counts.lost);
  summary->set_exited(counts.exited);
  summary->set_matching(counts.matching);
  if (next_page_token != nullptr) {
    *next_page_token =
        counts.next_rank >= 0 ? absl::StrCat(counts.next_rank) : "";
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* JobsService::CreateJob(
    grpc::CallbackServerContext* context, const v1::CreateJobRequest* request,
    v1::CreateJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(Create(*context, *request, response)));
  return reactor;
}

absl::Status JobsService::Create(const grpc::ServerContextBase& context,
                                 const v1::CreateJobRequest& request,
                                 v1::CreateJobResponse* response) {
  GS_ASSIGN_OR_RETURN(Caller caller, auth_->Identify(context));
  if (!caller.admin) {
    return absl::PermissionDeniedError(
        "only the admin creates jobs (its token, --admin_token_file)");
  }
  GS_ASSIGN_OR_RETURN(v1::JobStatus job, jobs_->Create(request.config()));
  if (auth_->enabled()) {
    GS_ASSIGN_OR_RETURN(std::string token,
                        auth_->IssueToken(job.config().job_id()));
    response->set_token(std::move(token));
  }
  *response->mutable_job() = std::move(job);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* JobsService::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::GetJobResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->job_id())) {
    return refused;
  }
  absl::Status status = JobStatus(
      request->job_id(), request->with_buckets(), response->mutable_job(),
      request->members(), response->mutable_next_page_token());
  if (!status.ok()) response->clear_job();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* JobsService::ListJobs(
    grpc::CallbackServerContext* context, const v1::ListJobsRequest* request,
    v1::ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = auth_->Identify(*context);
  if (caller.ok()) {
    for (v1::JobStatus& job : jobs_->List()) {
      // A job's token sees only its job.
      if (!Authenticator::Authorize(*caller, job.config().job_id()).ok()) {
        continue;
      }
      *response->add_jobs() = std::move(job);
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(caller.status()));
  return reactor;
}

absl::Status JobsService::WatchAllowed(const grpc::ServerContextBase& context,
                                       const v1::WatchJobRequest& request,
                                       ConnectionLimits::Lease* lease) {
  if (request.members().page_size() != 0 ||
      !request.members().page_token().empty()) {
    return absl::InvalidArgumentError(
        "a watch does not page its members: leave page_size and page_token "
        "unset");
  }
  GS_RETURN_IF_ERROR(auth_->Check(context, request.job_id()));
  GS_ASSIGN_OR_RETURN(*lease, limits_->Acquire(context.peer()));
  return absl::OkStatus();
}

grpc::ServerWriteReactor<v1::WatchJobResponse>* JobsService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  const absl::Duration interval = std::max(
      kMinWatchInterval, absl::Milliseconds(request->min_interval_ms()));
  auto* watch =
      new Watch(this, request->job_id(), interval, request->with_buckets(),
                request->members());
  watch->Allow(WatchAllowed(*context, *request, watch->lease()));
  {
    absl::MutexLock lock(&mu_);
    watches_.insert(watch);
  }
  watch->MaybeSend(clock_->Now());  // the first status at once
  return watch;
}

void JobsService::PollWatches() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<Watch*> released;
  for (Watch* watch : watches_) {
    if (watch->released()) {
      released.push_back(watch);
    } else {
      watch->MaybeSend(now);
    }
  }
  for (Watch* watch : released) {
    watches_.erase(watch);
    delete watch;
  }
}

}  // namespace gradsync
