// FakeCoordinatorClient: an in-memory CoordinatorClient for unit tests of
// what talks to the coordinator (the node agent, the runtime's pieces, the
// CLI), without a coordinator or a network.
//
// What it models, as simply as the tests need:
//   - joins: every Join/JoinNode is recorded and answered at once by the
//     assigner (default: one node; the processes of one call are ranks
//     0..n-1 of a world of n, in a new round of the job); HoldJoins() makes
//     them wait instead, until a Leave() of one of their incarnations
//     (CANCELLED, as the coordinator answers) or ReleaseJoins();
//   - the key-value store: per job round, with Wait's blocking;
//   - jobs: a job exists once joined or created; a completion report of
//     failure fails it (FAILED, with the report's message), reports of
//     success from every rank of its latest round make it SUCCEEDED;
//     SetJob() overrides what GetJob answers;
//   - heartbeat streams: what is sent is kept (heartbeats()); EndMembers()
//     ends every member heard from with a status, as the coordinator ends a
//     superseded round (ABORTED) or a failed job (FAILED_PRECONDITION);
//   - FailNext(): the next call of a method fails with a given status.
// Tokens are not modelled (UNIMPLEMENTED).
//
// Thread-safe. Streams must not outlive the fake.
#ifndef GRADSYNC_TESTS_TESTING_FAKE_COORDINATOR_CLIENT_H_
#define GRADSYNC_TESTS_TESTING_FAKE_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {

class FakeCoordinatorClient final : public CoordinatorClient {
 public:
  // Answers a node's join in round `round` (the job's rounds count from 1):
  // one assignment per process, in the request's order.
  using NodeAssigner = std::function<absl::StatusOr<std::vector<v1::Assignment>>(
      const v1::JoinNodeRequest& request, int64_t round)>;

  FakeCoordinatorClient();
  ~FakeCoordinatorClient() override;

  // --- What the test scripts ---
  void SetNodeAssigner(NodeAssigner assigner);
  // Joins wait (until a Leave of one of their incarnations, or
  // ReleaseJoins()) instead of being answered at once.
  void HoldJoins();
  void ReleaseJoins();
  // The next call of `method` ("JoinNode", "Set", "GetJob", ...) fails with
  // `status` instead of being carried out. Queued per method.
  void FailNext(const std::string& method, absl::Status status);
  // What GetJob(job) answers from now on (state, round, reason, ...),
  // replacing what the fake derived.
  void SetJob(const v1::JobStatus& job);
  // Ends every member heard from on a heartbeat stream and not yet ended,
  // with `why` (for a node stream: that member's answer carries the error).
  void EndMembers(const absl::Status& why);

  // --- What the test reads ---
  std::vector<v1::JoinNodeRequest> node_joins() const;
  std::vector<v1::JoinRequest> joins() const;
  // Leave calls: (job, incarnation).
  std::vector<std::pair<std::string, std::string>> leaves() const;
  std::vector<v1::ReportCompletionRequest> completions() const;
  // Every member heartbeat sent, node streams' included, in order.
  std::vector<v1::HeartbeatRequest> heartbeats() const;
  // Joins waiting now (see HoldJoins).
  int waiting_joins() const;
  // Blocks until `predicate` holds over the fake (evaluated whenever a call
  // changes it) or `timeout` passes; returns whether it holds.
  bool AwaitCondition(const std::function<bool(const FakeCoordinatorClient&)>&
                          predicate,
                      absl::Duration timeout) const;

  // --- CoordinatorClient ---
  absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& request,
                                      absl::Duration max_wait) override;
  absl::StatusOr<std::vector<v1::Assignment>> JoinNode(
      const v1::JoinNodeRequest& request, absl::Duration max_wait) override;
  absl::Status Leave(const std::string& job_id,
                     const std::string& incarnation_id) override;
  absl::Status Set(const v1::Scope& scope, const std::string& key,
                   const std::string& value) override;
  absl::StatusOr<std::string> Get(const v1::Scope& scope,
                                  const std::string& key) override;
  absl::StatusOr<int64_t> Add(const v1::Scope& scope, const std::string& key,
                              int64_t delta) override;
  absl::StatusOr<v1::CompareAndSetResponse> CompareAndSet(
      const v1::CompareAndSetRequest& request) override;
  absl::Status Wait(const v1::Scope& scope, const std::vector<std::string>& keys,
                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(const v1::Scope& scope,
                              const std::string& key) override;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const v1::Scope& scope, const std::string& prefix,
      bool keys_only) override;
  absl::StatusOr<v1::CreateJobResponse> CreateJob(
      const v1::JobConfig& config) override;
  absl::StatusOr<std::string> RotateToken(const std::string& job_id) override;
  absl::Status RevokeToken(const std::string& job_id) override;
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id,
                                       bool with_buckets) override;
  absl::StatusOr<v1::GetJobResponse> QueryJob(
      const v1::GetJobRequest& request) override;
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs() override;
  absl::Status WatchJob(
      const std::string& job_id, absl::Duration min_interval, bool with_buckets,
      const std::function<bool(const v1::JobStatus&)>& on_status,
      const v1::MemberQuery& members) override;
  std::unique_ptr<HeartbeatStream> OpenHeartbeatStream(
      std::function<void(const v1::HeartbeatResponse&)> on_response) override;
  std::unique_ptr<NodeHeartbeatStream> OpenNodeHeartbeatStream(
      std::function<void(const v1::NodeHeartbeatResponse&)> on_response)
      override;
  absl::StatusOr<v1::JobState> ReportCompletion(
      const v1::ReportCompletionRequest& request) override;
  std::string target() const override { return "fake-coordinator"; }

 private:
  template <typename Request, typename Response>
  class Stream;
  struct OpenStreams;  // the streams still open, to end members on

  // The scripted failure of `method`'s next call, or OK.
  absl::Status TakeFailureLocked(const std::string& method)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits while joins are held; CANCELLED when one of `incarnations` left.
  absl::Status AwaitJoinLocked(const std::vector<std::string>& incarnations)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's status, made when first seen.
  v1::JobStatus& JobLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `request` (a member's heartbeat) as sent.
  void RecordHeartbeat(const v1::HeartbeatRequest& request);

  mutable absl::Mutex mu_;
  NodeAssigner assigner_ ABSL_GUARDED_BY(mu_);
  bool hold_joins_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_joins_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::vector<absl::Status>> failures_
      ABSL_GUARDED_BY(mu_);
  std::vector<v1::JoinNodeRequest> node_joins_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::JoinRequest> joins_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> leaves_
      ABSL_GUARDED_BY(mu_);
  std::set<std::string> left_ ABSL_GUARDED_BY(mu_);  // incarnations
  std::vector<v1::ReportCompletionRequest> completions_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::JobStatus> jobs_ ABSL_GUARDED_BY(mu_);
  // Ranks of the job's latest round that reported success.
  std::map<std::string, std::set<int>> succeeded_ ABSL_GUARDED_BY(mu_);
  // (job, round) -> key -> value.
  std::map<std::pair<std::string, int64_t>, std::map<std::string, std::string>>
      kv_ ABSL_GUARDED_BY(mu_);
  // Bumped by every call and change, for AwaitCondition and WatchJob.
  int64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<OpenStreams> streams_;
};

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_FAKE_COORDINATOR_CLIENT_H_
