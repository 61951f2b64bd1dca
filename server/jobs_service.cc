#include "server/jobs_service.h"

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/job_config.h"

namespace gradsync {
namespace {

// The shortest interval between two statuses of one watch.
constexpr absl::Duration kMinWatchInterval = absl::Milliseconds(100);

}  // namespace

// One WatchJob stream. MaybeSend() writes the job's status when it changed
// (one write at a time); the stream finishes after a terminal status, when
// the job is gone, or when the client cancels. Lifetime: owned by the
// service's watch set; deleted by PollWatches (or the service's destructor)
// once gRPC called OnDone.
class JobsService::Watch final
    : public grpc::ServerWriteReactor<v1::WatchJobResponse> {
 public:
  // `refused`: not OK when the caller may not watch the job; the watch then
  // ends at once with it.
  Watch(const JobsService* service, std::string job_id,
        absl::Duration min_interval, bool with_buckets, absl::Status refused)
      : service_(service),
        job_id_(std::move(job_id)),
        min_interval_(min_interval),
        with_buckets_(with_buckets),
        refused_(std::move(refused)) {}

  bool released() const { return released_.load(); }

  void MaybeSend(absl::Time now) {
    absl::MutexLock lock(&mu_);
    if (finishing_ || writing_ || now < next_send_) return;
    v1::JobStatus status;
    absl::Status read =
        refused_.ok() ? service_->JobStatus(job_id_, with_buckets_, &status)
                      : refused_;
    if (!read.ok()) {
      finishing_ = true;
      Finish(ToGrpcStatus(read));
      return;
    }
    std::string bytes = status.SerializeAsString();
    if (bytes == last_sent_) return;
    last_sent_ = std::move(bytes);
    final_ = IsTerminal(status.state());
    response_.mutable_job()->Swap(&status);
    writing_ = true;
    next_send_ = now + min_interval_;
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (finishing_) return;
    if (!ok || final_) {
      finishing_ = true;
      Finish(ok ? grpc::Status::OK
                : grpc::Status(grpc::StatusCode::CANCELLED, "watch ended"));
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (finishing_ || writing_) return;  // a write in flight fails and finishes
    finishing_ = true;
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  void OnDone() override { released_.store(true); }

 private:
  const JobsService* const service_;
  const std::string job_id_;
  const absl::Duration min_interval_;
  const bool with_buckets_;
  const absl::Status refused_;
  std::atomic<bool> released_{false};

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool final_ ABSL_GUARDED_BY(mu_) = false;  // the status in flight is terminal
  absl::Time next_send_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string last_sent_ ABSL_GUARDED_BY(mu_);
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
                         Authenticator* auth)
    : jobs_(jobs),
      rendezvous_(rendezvous),
      health_(health),
      clock_(clock),
      auth_(auth) {
  SetMessageAllocatorFor_GetJob(&get_job_allocator_);
}

JobsService::~JobsService() {
  // The server is shut down: every watch has had its OnDone.
  absl::MutexLock lock(&mu_);
  for (Watch* watch : watches_) delete watch;
}

absl::Status JobsService::JobStatus(const std::string& job_id,
                                    bool with_buckets,
                                    v1::JobStatus* out) const {
  absl::Status status = ValidateJobId(job_id);
  if (status.ok()) status = jobs_->CopyTo(job_id, out);
  if (status.ok()) {
    rendezvous_->DescribeWaiting(job_id, out);
    health_->Describe(out, with_buckets);
  }
  return status;
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
  absl::Status status = JobStatus(request->job_id(), request->with_buckets(),
                                  response->mutable_job());
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

grpc::ServerWriteReactor<v1::WatchJobResponse>* JobsService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  const absl::Duration interval = std::max(
      kMinWatchInterval, absl::Milliseconds(request->min_interval_ms()));
  auto* watch =
      new Watch(this, request->job_id(), interval, request->with_buckets(),
                auth_->Check(*context, request->job_id()));
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
