#include "server/jobs_service.h"

#include "common/grpc_status.h"
#include "common/job_config.h"

namespace gradsync {

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
  absl::Status status = ValidateJobId(request->job_id());
  if (status.ok()) {
    absl::StatusOr<v1::JobStatus> job = jobs_->Get(request->job_id());
    status = job.status();
    if (job.ok()) {
      *response->mutable_job() = *std::move(job);
      rendezvous_->DescribeWaiting(request->job_id(), response->mutable_job());
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
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

}  // namespace gradsync
