#include "tests/testing/fake_coordinator_client.h"

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

std::string MemberKey(const v1::MemberRef& m) {
  return absl::StrCat(m.job_id(), "/", m.round(), "/", m.rank(), "/",
                      m.incarnation_id());
}

// One process per assignment, one node, a new round: see the header.
absl::StatusOr<std::vector<v1::Assignment>> OneNode(
    const v1::JoinNodeRequest& request, int64_t round) {
  std::vector<v1::Assignment> assignments;
  const int n = request.processes_size();
  for (int i = 0; i < n; ++i) {
    v1::Assignment a;
    a.set_job_id(request.job_id());
    a.set_round(round);
    a.set_rank(i);
    a.set_local_rank(i);
    a.set_world_size(n);
    a.set_local_world_size(n);
    a.set_node_rank(0);
    a.set_num_nodes(1);
    a.set_backend(v1::BACKEND_GLOO);
    a.set_single_host(true);
    assignments.push_back(a);
  }
  return assignments;
}

}  // namespace

// What every fake stream can be asked to do by the fake.
class FakeStreamEnds {
 public:
  virtual ~FakeStreamEnds() = default;
  // Ends every member heard from on the stream with `why`.
  virtual void EndMembers(const absl::Status& why) = 0;
};

struct FakeCoordinatorClient::OpenStreams {
  // Held while a stream is told to end members (its callbacks included), so
  // that no stream is destroyed meanwhile.
  absl::Mutex mu;
  std::set<FakeStreamEnds*> open ABSL_GUARDED_BY(mu);
};

template <typename Request, typename Response>
class FakeCoordinatorClient::Stream final : public OutgoingStream<Request>,
                                            public FakeStreamEnds {
 public:
  Stream(FakeCoordinatorClient* fake,
         std::function<void(const Response&)> on_response)
      : fake_(fake), on_response_(std::move(on_response)) {
    absl::MutexLock lock(&fake_->streams_->mu);
    fake_->streams_->open.insert(this);
  }
  ~Stream() override {
    absl::MutexLock lock(&fake_->streams_->mu);
    fake_->streams_->open.erase(this);
  }

  bool Send(Request request) override {
    {
      absl::MutexLock lock(&mu_);
      if (ended_.has_value()) return false;
      Note(request);
    }
    ForEachHeartbeat(request, [this](const v1::HeartbeatRequest& heartbeat) {
      fake_->RecordHeartbeat(heartbeat);
    });
    return true;
  }
  std::optional<absl::Status> ended() const override {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  absl::Status Close(absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (!ended_.has_value()) ended_ = absl::OkStatus();
    return *ended_;
  }
  void EndMembers(const absl::Status& why) override;

 private:
  static void ForEachHeartbeat(
      const v1::HeartbeatRequest& request,
      const std::function<void(const v1::HeartbeatRequest&)>& f) {
    f(request);
  }
  static void ForEachHeartbeat(
      const v1::NodeHeartbeatRequest& request,
      const std::function<void(const v1::HeartbeatRequest&)>& f) {
    for (const v1::HeartbeatRequest& h : request.heartbeats()) f(h);
  }
  void Note(const v1::HeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    members_[MemberKey(request.member())] = request.member();
  }
  void Note(const v1::NodeHeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const v1::HeartbeatRequest& h : request.heartbeats()) {
      members_[MemberKey(h.member())] = h.member();
    }
    for (const v1::MemberRef& m : request.closed()) {
      members_.erase(MemberKey(m));
    }
  }

  FakeCoordinatorClient* const fake_;
  const std::function<void(const Response&)> on_response_;
  mutable absl::Mutex mu_;
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);
  // Members heard from and not ended, by MemberKey.
  std::map<std::string, v1::MemberRef> members_ ABSL_GUARDED_BY(mu_);
};

// A member's own stream ends as a whole.
template <>
void FakeCoordinatorClient::Stream<v1::HeartbeatRequest, v1::HeartbeatResponse>::
    EndMembers(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (!ended_.has_value() && !members_.empty()) ended_ = why;
  members_.clear();
}

// A node's stream answers each member with the error, as the coordinator
// does; the stream stays open.
template <>
void FakeCoordinatorClient::Stream<v1::NodeHeartbeatRequest,
                                   v1::NodeHeartbeatResponse>::
    EndMembers(const absl::Status& why) {
  v1::NodeHeartbeatResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (ended_.has_value()) return;
    for (const auto& [key, member] : members_) {
      v1::MemberHeartbeatResponse* answer = response.add_answers();
      *answer->mutable_member() = member;
      answer->set_error_code(static_cast<int>(why.code()));
      answer->set_error_message(std::string(why.message()));
    }
    members_.clear();
  }
  if (response.answers_size() > 0 && on_response_) on_response_(response);
}

FakeCoordinatorClient::FakeCoordinatorClient()
    : assigner_(OneNode), streams_(std::make_unique<OpenStreams>()) {}

FakeCoordinatorClient::~FakeCoordinatorClient() = default;

void FakeCoordinatorClient::SetNodeAssigner(NodeAssigner assigner) {
  absl::MutexLock lock(&mu_);
  assigner_ = std::move(assigner);
}

void FakeCoordinatorClient::HoldJoins() {
  absl::MutexLock lock(&mu_);
  hold_joins_ = true;
}

void FakeCoordinatorClient::ReleaseJoins() {
  absl::MutexLock lock(&mu_);
  hold_joins_ = false;
}

void FakeCoordinatorClient::FailNext(const std::string& method,
                                     absl::Status status) {
  absl::MutexLock lock(&mu_);
  failures_[method].push_back(std::move(status));
}

void FakeCoordinatorClient::SetJob(const v1::JobStatus& job) {
  absl::MutexLock lock(&mu_);
  jobs_[job.config().job_id()] = job;
}

void FakeCoordinatorClient::EndMembers(const absl::Status& why) {
  absl::MutexLock lock(&streams_->mu);
  for (FakeStreamEnds* stream : streams_->open) stream->EndMembers(why);
}

std::vector<v1::JoinNodeRequest> FakeCoordinatorClient::node_joins() const {
  absl::MutexLock lock(&mu_);
  return node_joins_;
}

std::vector<v1::JoinRequest> FakeCoordinatorClient::joins() const {
  absl::MutexLock lock(&mu_);
  return joins_;
}

std::vector<std::pair<std::string, std::string>> FakeCoordinatorClient::leaves()
    const {
  absl::MutexLock lock(&mu_);
  return leaves_;
}

std::vector<v1::ReportCompletionRequest> FakeCoordinatorClient::completions()
    const {
  absl::MutexLock lock(&mu_);
  return completions_;
}

std::vector<v1::HeartbeatRequest> FakeCoordinatorClient::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

int FakeCoordinatorClient::waiting_joins() const {
  absl::MutexLock lock(&mu_);
  return waiting_joins_;
}

bool FakeCoordinatorClient::AwaitCondition(
    const std::function<bool(const FakeCoordinatorClient&)>& predicate,
    absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  // The predicate reads the fake through its public calls, which take mu_:
  // it runs between waits for a change, not under the lock.
  while (true) {
    int64_t seen;
    {
      absl::MutexLock lock(&mu_);
      seen = changes_;
    }
    if (predicate(*this)) return true;
    absl::MutexLock lock(&mu_);
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return changes_ != seen;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&changed), deadline)) break;
  }
  return predicate(*this);
}

absl::Status FakeCoordinatorClient::TakeFailureLocked(const std::string& method) {
  ++changes_;
  auto queued = failures_.find(method);
  if (queued == failures_.end() || queued->second.empty()) {
    return absl::OkStatus();
  }
  absl::Status failure = queued->second.front();
  queued->second.erase(queued->second.begin());
  return failure;
}

absl::Status FakeCoordinatorClient::AwaitJoinLocked(
    const std::vector<std::string>& incarnations) {
  auto left = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::any_of(incarnations.begin(), incarnations.end(),
                       [&](const std::string& i) { return left_.count(i); });
  };
  auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !hold_joins_ || left();
  };
  ++waiting_joins_;
  ++changes_;
  mu_.Await(absl::Condition(&released));
  --waiting_joins_;
  ++changes_;
  if (left()) return absl::CancelledError("the process left the job");
  return absl::OkStatus();
}

v1::JobStatus& FakeCoordinatorClient::JobLocked(const std::string& job_id) {
  v1::JobStatus& job = jobs_[job_id];
  if (job.config().job_id().empty()) {
    job.mutable_config()->set_job_id(job_id);
    job.set_state(v1::JOB_STATE_WAITING);
  }
  return job;
}

void FakeCoordinatorClient::RecordHeartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  heartbeats_.push_back(request);
  ++changes_;
}

absl::StatusOr<std::vector<v1::Assignment>> FakeCoordinatorClient::JoinNode(
    const v1::JoinNodeRequest& request, absl::Duration) {
  absl::MutexLock lock(&mu_);
  node_joins_.push_back(request);
  GS_RETURN_IF_ERROR(TakeFailureLocked("JoinNode"));
  std::vector<std::string> incarnations;
  for (const v1::ProcessJoin& p : request.processes()) {
    incarnations.push_back(p.node().incarnation_id());
  }
  absl::Status waited = AwaitJoinLocked(incarnations);
  if (!waited.ok()) return waited;
  v1::JobStatus& job = JobLocked(request.job_id());
  const int64_t round = job.round() + 1;
  absl::StatusOr<std::vector<v1::Assignment>> assignments =
      assigner_(request, round);
  if (!assignments.ok()) return assignments.status();
  job.set_round(round);
  job.set_state(v1::JOB_STATE_RUNNING);
  if (!assignments->empty()) job.set_world_size((*assignments)[0].world_size());
  succeeded_[request.job_id()].clear();
  ++changes_;
  return assignments;
}

absl::StatusOr<v1::Assignment> FakeCoordinatorClient::Join(
    const v1::JoinRequest& request, absl::Duration max_wait) {
  {
    absl::MutexLock lock(&mu_);
    joins_.push_back(request);
    GS_RETURN_IF_ERROR(TakeFailureLocked("Join"));
  }
  // One process on a node of its own: the node assigner's answer.
  v1::JoinNodeRequest node;
  node.set_job_id(request.job_id());
  *node.mutable_config() = request.config();
  node.set_rejoin_reason(request.rejoin_reason());
  v1::ProcessJoin* process = node.add_processes();
  *process->mutable_node() = request.node();
  process->set_last_round(request.last_round());
  absl::StatusOr<std::vector<v1::Assignment>> assigned = JoinNode(node, max_wait);
  {
    absl::MutexLock lock(&mu_);
    node_joins_.pop_back();  // recorded as a Join
  }
  if (!assigned.ok()) return assigned.status();
  return (*assigned)[0];
}

absl::Status FakeCoordinatorClient::Leave(const std::string& job_id,
                                          const std::string& incarnation_id) {
  absl::MutexLock lock(&mu_);
  leaves_.emplace_back(job_id, incarnation_id);
  left_.insert(incarnation_id);
  return TakeFailureLocked("Leave");
}

absl::Status FakeCoordinatorClient::Set(const v1::Scope& scope,
                                        const std::string& key,
                                        const std::string& value) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("Set"));
  kv_[{scope.job_id(), scope.round()}][key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> FakeCoordinatorClient::Get(const v1::Scope& scope,
                                                       const std::string& key) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("Get"));
  const auto& values = kv_[{scope.job_id(), scope.round()}];
  auto value = values.find(key);
  if (value == values.end()) {
    return absl::NotFoundError(absl::StrCat("no key '", key, "'"));
  }
  return value->second;
}

absl::StatusOr<int64_t> FakeCoordinatorClient::Add(const v1::Scope& scope,
                                                   const std::string& key,
                                                   int64_t delta) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("Add"));
  std::string& value = kv_[{scope.job_id(), scope.round()}][key];
  int64_t sum = delta;
  if (!value.empty()) sum += std::stoll(value);
  value = absl::StrCat(sum);
  return sum;
}

absl::StatusOr<v1::CompareAndSetResponse> FakeCoordinatorClient::CompareAndSet(
    const v1::CompareAndSetRequest& request) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("CompareAndSet"));
  auto& values = kv_[{request.scope().job_id(), request.scope().round()}];
  auto value = values.find(request.key());
  v1::CompareAndSetResponse response;
  const bool matches = value == values.end()
                           ? request.expect_absent()
                           : !request.expect_absent() &&
                                 value->second == request.expected();
  if (matches) values[request.key()] = request.desired();
  response.set_swapped(matches);
  value = values.find(request.key());
  response.set_exists(value != values.end());
  if (value != values.end()) response.set_value(value->second);
  return response;
}

absl::Status FakeCoordinatorClient::Wait(const v1::Scope& scope,
                                         const std::vector<std::string>& keys,
                                         absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("Wait"));
  const std::pair<std::string, int64_t> at{scope.job_id(), scope.round()};
  auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto& values = kv_[at];
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
      return values.count(k) > 0;
    });
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&all), timeout)) {
    return absl::DeadlineExceededError("the keys did not appear in time");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeCoordinatorClient::Delete(const v1::Scope& scope,
                                                   const std::string& key) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("Delete"));
  return kv_[{scope.job_id(), scope.round()}].erase(key) > 0;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
FakeCoordinatorClient::List(const v1::Scope& scope, const std::string& prefix,
                            bool keys_only) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("List"));
  std::vector<std::pair<std::string, std::string>> listed;
  for (const auto& [key, value] : kv_[{scope.job_id(), scope.round()}]) {
    if (absl::StartsWith(key, prefix)) {
      listed.emplace_back(key, keys_only ? "" : value);
    }
  }
  return listed;
}

absl::StatusOr<v1::CreateJobResponse> FakeCoordinatorClient::CreateJob(
    const v1::JobConfig& config) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("CreateJob"));
  if (jobs_.count(config.job_id()) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("job '", config.job_id(), "' exists"));
  }
  v1::JobStatus& job = JobLocked(config.job_id());
  *job.mutable_config() = config;
  v1::CreateJobResponse response;
  *response.mutable_job() = job;
  return response;
}

absl::StatusOr<std::string> FakeCoordinatorClient::RotateToken(
    const std::string&) {
  return absl::UnimplementedError("the fake coordinator has no tokens");
}

absl::Status FakeCoordinatorClient::RevokeToken(const std::string&) {
  return absl::UnimplementedError("the fake coordinator has no tokens");
}

absl::StatusOr<v1::JobStatus> FakeCoordinatorClient::GetJob(
    const std::string& job_id, bool) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("GetJob"));
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  }
  return job->second;
}

absl::StatusOr<v1::GetJobResponse> FakeCoordinatorClient::QueryJob(
    const v1::GetJobRequest& request) {
  absl::StatusOr<v1::JobStatus> job = GetJob(request.job_id(), false);
  if (!job.ok()) return job.status();
  v1::GetJobResponse response;
  *response.mutable_job() = *std::move(job);
  return response;
}

absl::StatusOr<std::vector<v1::JobStatus>> FakeCoordinatorClient::ListJobs() {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(TakeFailureLocked("ListJobs"));
  std::vector<v1::JobStatus> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(job);
  return jobs;
}

absl::Status FakeCoordinatorClient::WatchJob(
    const std::string& job_id, absl::Duration min_interval, bool,
    const std::function<bool(const v1::JobStatus&)>& on_status,
    const v1::MemberQuery&) {
  std::optional<std::string> last;
  while (true) {
    absl::StatusOr<v1::JobStatus> job = GetJob(job_id, false);
    if (!job.ok()) return job.status();
    const std::string now = job->SerializeAsString();
    if (!last.has_value() || *last != now) {
      if (!on_status(*job)) {
        return absl::CancelledError("the watch was stopped by its caller");
      }
      last = now;
    }
    if (job->state() == v1::JOB_STATE_SUCCEEDED ||
        job->state() == v1::JOB_STATE_FAILED) {
      return absl::OkStatus();
    }
    absl::MutexLock lock(&mu_);
    const int64_t seen = changes_;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return changes_ != seen;
    };
    mu_.AwaitWithTimeout(absl::Condition(&changed),
                         std::max(min_interval, absl::Milliseconds(10)));
  }
}

std::unique_ptr<HeartbeatStream> FakeCoordinatorClient::OpenHeartbeatStream(
    std::function<void(const v1::HeartbeatResponse&)> on_response) {
  return std::make_unique<Stream<v1::HeartbeatRequest, v1::HeartbeatResponse>>(
      this, std::move(on_response));
}

std::unique_ptr<NodeHeartbeatStream>
FakeCoordinatorClient::OpenNodeHeartbeatStream(
    std::function<void(const v1::NodeHeartbeatResponse&)> on_response) {
  return std::make_unique<
      Stream<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse>>(
      this, std::move(on_response));
}

absl::StatusOr<v1::JobState> FakeCoordinatorClient::ReportCompletion(
    const v1::ReportCompletionRequest& request) {
  absl::MutexLock lock(&mu_);
  completions_.push_back(request);
  GS_RETURN_IF_ERROR(TakeFailureLocked("ReportCompletion"));
  v1::JobStatus& job = JobLocked(request.member().job_id());
  if (!request.success()) {
    job.set_state(v1::JOB_STATE_FAILED);
    job.set_reason(request.message());
  } else if (request.member().round() == job.round()) {
    std::set<int>& done = succeeded_[job.config().job_id()];
    done.insert(request.member().rank());
    if (static_cast<int>(done.size()) >= job.world_size() &&
        job.state() != v1::JOB_STATE_FAILED) {
      job.set_state(v1::JOB_STATE_SUCCEEDED);
    }
  }
  return job.state();
}

}  // namespace gradsync
