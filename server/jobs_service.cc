#include "server/jobs_service.h"

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "common/grpc_status.h"
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
  Watch(const JobsService* service, std::string job_id,
        absl::Duration min_interval)
      : service_(service),
        job_id_(std::move(job_id)),
        min_interval_(min_interval) {}

  bool released() const { return released_.load(); }

  void MaybeSend(absl::Time now) {
    absl::MutexLock lock(&mu_);
    if (finishing_ || writing_ || now < next_send_) return;
    absl::StatusOr<v1::JobStatus> status = service_->JobStatus(job_id_);
    if (!status.ok()) {
      finishing_ = true;
      Finish(ToGrpcStatus(status.status()));
      return;
    }
    std::string bytes = status->SerializeAsString();
    if (bytes == last_sent_) return;
    last_sent_ = std::move(bytes);
    final_ = IsTerminal(status->state());
    *response_.mutable_job() = *std::move(status);
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
  std::atomic<bool> released_{false};

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool final_ ABSL_GUARDED_BY(mu_) = false;  // the status in flight is terminal
  absl::Time next_send_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string last_sent_ ABSL_GUARDED_BY(mu_);
  v1::WatchJobResponse response_ ABSL_GUARDED_BY(mu_);
};

JobsService::JobsService(JobManager* jobs, const RendezvousManager* rendezvous,
                         const HealthManager* health, Clock* clock)
    : jobs_(jobs), rendezvous_(rendezvous), health_(health), clock_(clock) {}

JobsService::~JobsService() {
  // The server is shut down: every watch has had its OnDone.
  absl::MutexLock lock(&mu_);
  for (Watch* watch : watches_) delete watch;
}

absl::StatusOr<v1::JobStatus> JobsService::JobStatus(
    const std::string& job_id) const {
  absl::Status valid = ValidateJobId(job_id);
  if (!valid.ok()) return valid;
  absl::StatusOr<v1::JobStatus> job = jobs_->Get(job_id);
  if (job.ok()) {
    rendezvous_->DescribeWaiting(job_id, &*job);
    health_->Describe(&*job);
  }
  return job;
}

grpc::ServerUnaryReactor* JobsService::CreateJob(
    grpc::CallbackServerContext* context, const v1::CreateJobRequest* request,
    v1::CreateJobResponse* response) {
  absl::StatusOr<v1::JobStatus> job = jobs_->Create(request->config());
  if (job.ok()) *response->mutable_job() = *std::move(job);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* JobsService::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::GetJobResponse* response) {
  absl::StatusOr<v1::JobStatus> job = JobStatus(request->job_id());
  if (job.ok()) *response->mutable_job() = *std::move(job);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* JobsService::ListJobs(
    grpc::CallbackServerContext* context, const v1::ListJobsRequest* request,
    v1::ListJobsResponse* response) {
  for (v1::JobStatus& job : jobs_->List()) {
    *response->add_jobs() = std::move(job);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::WatchJobResponse>* JobsService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  const absl::Duration interval = std::max(
      kMinWatchInterval, absl::Milliseconds(request->min_interval_ms()));
  auto* watch = new Watch(this, request->job_id(), interval);
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
