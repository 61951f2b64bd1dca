#ifndef GRADSYNC_SERVER_JOBS_SERVICE_H_
#define GRADSYNC_SERVER_JOBS_SERVICE_H_

#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "server/job_manager.h"
#include "server/rendezvous_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Jobs: job records from JobManager, with the
// waiting and spare processes from RendezvousManager. Thread-safe; the
// managers must outlive it.
class JobsService final : public v1::Jobs::CallbackService {
 public:
  JobsService(JobManager* jobs, const RendezvousManager* rendezvous)
      : jobs_(jobs), rendezvous_(rendezvous) {}

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const v1::CreateJobRequest* request,
                                      v1::CreateJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;

 private:
  JobManager* const jobs_;
  const RendezvousManager* const rendezvous_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOBS_SERVICE_H_
