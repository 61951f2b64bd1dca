#ifndef GRADSYNC_SERVER_JOBS_SERVICE_H_
#define GRADSYNC_SERVER_JOBS_SERVICE_H_

#include <grpcpp/support/message_allocator.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "server/authenticator.h"
#include "server/connection_limits.h"
#include "server/health_manager.h"
#include "server/job_manager.h"
#include "server/rendezvous_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Jobs: job records from JobManager, with the
// waiting and spare processes from RendezvousManager and members' metrics and
// the diagnosis from HealthManager. Watches hold no thread: PollWatches()
// sends their updates. Thread-safe; the managers and `clock` must outlive it,
// and it must outlive the server it is registered with.
class JobsService final : public v1::Jobs::CallbackService {
 public:
  // `auth` decides who may call about which job, and issues job tokens;
  // `limits` bounds the watches of a connection.
  JobsService(JobManager* jobs, const RendezvousManager* rendezvous,
              const HealthManager* health, Clock* clock, Authenticator* auth,
              ConnectionLimits* limits);
  ~JobsService() override;

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const v1::CreateJobRequest* request,
                                      v1::CreateJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* context,
      const v1::WatchJobRequest* request) override;

  // Sends each watch whose interval has passed the job's status if it
  // changed, and releases finished watches. Called every poll interval.
  void PollWatches();

  // One job's status, as GetJob answers it, written into `out`: with the
  // members `query` selects (all by default) and the summary.
  // `next_page_token` (may be null) gets where the next page starts.
  // INVALID_ARGUMENT for a bad query.
  absl::Status JobStatus(const std::string& job_id, bool with_buckets,
                         v1::JobStatus* out,
                         const v1::MemberQuery& query = v1::MemberQuery(),
                         std::string* next_page_token = nullptr) const;

 private:
  class Watch;

  // GetJob builds its answer on a per-call arena: a status of 10,000 members
  // is tens of thousands of small allocations otherwise.
  class ArenaAllocator final
      : public grpc::MessageAllocator<v1::GetJobRequest, v1::GetJobResponse> {
   public:
    grpc::MessageHolder<v1::GetJobRequest, v1::GetJobResponse>*
    AllocateMessages() override;
  };

  // Whether `request` may start: the caller may watch the job, the query
  // does not page and the connection may hold one more stream (`lease`).
  absl::Status WatchAllowed(const grpc::ServerContextBase& context,
                            const v1::WatchJobRequest& request,
                            ConnectionLimits::Lease* lease);

  // CreateJob: the admin's only; issues the job's token when tokens are on.
  absl::Status Create(const grpc::ServerContextBase& context,
                      const v1::CreateJobRequest& request,
                      v1::CreateJobResponse* response);

  JobManager* const jobs_;
  const RendezvousManager* const rendezvous_;
  const HealthManager* const health_;
  Clock* const clock_;
  Authenticator* const auth_;
  ConnectionLimits* const limits_;
  ArenaAllocator get_job_allocator_;

  absl::Mutex mu_;
  absl::flat_hash_set<Watch*> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOBS_SERVICE_H_
