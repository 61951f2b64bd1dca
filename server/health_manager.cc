#include "server/health_manager.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/health_wire.h"

namespace gradsync {
namespace {

std::string RoundOver(absl::string_view job_id, int64_t round) {
  return absl::StrCat("round ", round, " of job '", job_id,
                      "' is over: rejoin to get the next round");
}

// A member's state reason from its completion report.
std::string CompletionText(const v1::ReportCompletionRequest& request) {
  if (request.success()) return "succeeded";
  return absl::StrCat("failed with exit code ", request.exit_code(),
                      request.message().empty() ? "" : ": ", request.message());
}

// `config` with the shedding settings left to the coordinator filled in.
HealthConfig WithDefaults(HealthConfig config) {
  if (config.shedding.max_delay <= absl::ZeroDuration()) {
    config.shedding.max_delay = config.heartbeat_interval / 2;
  }
  return config;
}

}  // namespace

HealthManager::HealthManager(JobManager* jobs, Clock* clock,
                             HealthConfig config, LossCallback on_loss,
                             JobEndedCallback on_job_ended,
                             HealCallback on_heal,
                             RebalanceCallback on_rebalance)
    : jobs_(jobs),
      clock_(clock),
      config_(config),
      on_loss_(std::move(on_loss)),
      on_job_ended_(std::move(on_job_ended)),
      on_heal_(std::move(on_heal)),
      on_rebalance_(std::move(on_rebalance)),
      queue_delays_(config.completion_queues),
      shedder_(WithDefaults(config).shedding, clock->Now()) {}

HealthManager::~HealthManager() = default;

std::unique_ptr<HealthManager::Session> HealthManager::NewSession(int queue) {
  static std::atomic<uint64_t> next_id{1};
  auto session = std::make_unique<Session>();
  session->id = next_id.fetch_add(1, std::memory_order_relaxed);
  session->queue = queue;
  return session;
}

namespace {

// OK when `member` is of the round `phase` says is live (CheckRoundIsLive).
absl::Status CheckRound(const v1::MemberRef& member, const JobPhase& phase) {
  return CheckRoundIsLive(member.job_id(), member.round(), phase.round,
                          phase.state != v1::JOB_STATE_WAITING);
}

}  // namespace

absl::StatusOr<std::shared_ptr<HealthManager::JobHealth>>
HealthManager::FindOrStart(const v1::MemberRef& member,
                           absl::string_view started_by,
                           int grace_windows) {
  auto monitored = [&]() -> std::shared_ptr<JobHealth> {
    absl::ReaderMutexLock lock(&mu_);
    auto it = jobs_health_.find(member.job_id());
    if (it != jobs_health_.end() && it->second->round == member.round()) {
      return it->second;
    }
    return nullptr;
  };
  if (std::shared_ptr<JobHealth> job = monitored()) return job;
  // Not monitored yet, or another round: ask the job registry, cheaply
  // first (members of an old round keep heartbeating until they learn it).
  GS_ASSIGN_OR_RETURN(JobPhase latest, jobs_->GetPhase(member.job_id()));
  GS_RETURN_IF_ERROR(CheckRound(member, latest));
  // One start at a time: the first heartbeats of a large round arrive
  // together, and each start copies the round's members.
  absl::MutexLock starting(&start_mu_);
  if (std::shared_ptr<JobHealth> job = monitored()) return job;
  GS_ASSIGN_OR_RETURN(RoundMembers round,
                      jobs_->GetRoundMembers(member.job_id()));
  const JobPhase& phase = round.phase;
  GS_RETURN_IF_ERROR(CheckRound(member, phase));
  return Install(NewJobHealth(member.job_id(), std::move(round), started_by,
                              grace_windows));
}

std::shared_ptr<HealthManager::JobHealth> HealthManager::NewJobHealth(
    const std::string& job_id, RoundMembers round,
    absl::string_view started_by, int grace_windows) const {
  auto job = std::make_shared<JobHealth>();
  const v1::JobConfig& c = round.config;
  // The job's own setting where it has one, else the coordinator's.
  const auto or_default = [](const google::protobuf::Duration& set,
                             absl::Duration fallback) {
    const absl::Duration d = FromProtoDuration(set);
    return d > absl::ZeroDuration() ? d : fallback;
  };
  job->job_id = job_id;
  job->round = round.phase.round;
  job->started_by = std::string(started_by);
  job->interval = or_default(c.heartbeat_interval(), config_.heartbeat_interval);
  job->missed = c.missed_heartbeats() > 0 ? c.missed_heartbeats()
                                          : config_.missed_heartbeats;
  job->policy = c.failure_policy() == v1::FAILURE_POLICY_FAIL
                    ? v1::FAILURE_POLICY_FAIL
                    : v1::FAILURE_POLICY_DEGRADE;
  job->straggler_threshold =
      or_default(c.straggler_threshold(), config_.straggler_threshold);
  job->late_after = job->interval * config_.shedding.late_ratio;
  job->reconnect_grace =
      config_.reconnect_grace.value_or(job->interval * job->missed);
  const size_t world = round.incarnations.size();
  const absl::Time now = clock_->Now();
  job->not_lost_before = now + grace_windows * job->interval * job->missed;
  absl::MutexLock lock(&job->mu);
  job->state = round.phase.state;
  job->reason = round.phase.reason;
  job->last_progress = now;
  job->members.resize(world);
  for (size_t r = 0; r < world; ++r) {
    MemberHealth& m = job->members[r];
    m.incarnation_id = std::move(round.incarnations[r]);
    m.host = std::move(round.hosts[r]);
    m.last_seen = now;
    // Recorded before a restart: a lost member stays lost, and one that
    // exited while the job runs on had succeeded.
    m.state = round.states[r] == v1::MEMBER_STATE_UNSPECIFIED
                  ? v1::MEMBER_STATE_ACTIVE
                  : round.states[r];
    if (m.state == v1::MEMBER_STATE_EXITED) {
      m.succeeded = true;
      ++job->succeeded;
    }
  }
  job->stragglers.emplace(static_cast<int>(world), job->straggler_threshold);
  job->balancer.emplace(static_cast<int>(world));
  job->rebalance = c.straggler_policy() != v1::STRAGGLER_POLICY_REPORT;
  std::optional<absl::Duration> fixed_hang;
  if (FromProtoDuration(c.hang_timeout()) > absl::ZeroDuration()) {
    fixed_hang = FromProtoDuration(c.hang_timeout());
  }
  job->hang_timeout.emplace(
      fixed_hang,
      SelfSetTimeout::Bounds{config_.min_hang_timeout, config_.max_hang_timeout,
                          config_.hang_timeout, config_.hang_timeout_factor});
  job->heal_divergence = c.divergence_policy() != v1::DIVERGENCE_POLICY_FAIL;
  job->divergence.emplace(static_cast<int>(world));
  return job;
}

absl::StatusOr<std::shared_ptr<HealthManager::JobHealth>>
HealthManager::Install(std::shared_ptr<JobHealth> job) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<JobHealth>& slot = jobs_health_[job->job_id];
  if (slot != nullptr && slot->round == job->round) return slot;  // a race
  if (slot != nullptr && slot->round > job->round) {
    return absl::AbortedError(RoundOver(job->job_id, job->round));
  }
  if (slot != nullptr) {
    absl::MutexLock old_lock(&slot->mu);
    slot->current = false;
  }
  slot = job;
  auto reform = reform_requests_.find(job->job_id);
  absl::MutexLock job_lock(&job->mu);
  if (reform != reform_requests_.end() && reform->second == job->round) {
    job->reform_requested = true;
  }
  GS_LOG(INFO) << "job '" << job->job_id << "' round " << job->round
               << ": monitoring " << job->members.size()
               << " member(s), heartbeat every "
               << absl::FormatDuration(job->interval) << ", lost after "
               << job->missed << " missed";
  return job;
}

void HealthManager::OnRoundEvent(const RoundEvent& event) {
  switch (event.kind) {
    case RoundEvent::Kind::kSuperseded:
      RoundEnded(event.job_id, event.round);
      break;
    case RoundEvent::Kind::kReformRequested:
      ReformRequested(event.job_id, event.round);
      break;
    case RoundEvent::Kind::kForgotten:
      Forget(event.job_id);
      break;
    case RoundEvent::Kind::kClosed:    // monitored from its first heartbeat
    case RoundEvent::Kind::kJobEnded:  // read from the job record
      break;
  }
}

void HealthManager::RoundEnded(const std::string& job_id, int64_t round) {
  absl::ReaderMutexLock lock(&mu_);
  auto it = jobs_health_.find(job_id);
  if (it != jobs_health_.end() && it->second->round <= round) {
    it->second->superseded.store(true);
  }
}

void HealthManager::ReformRequested(const std::string& job_id,
                                    int64_t round) {
  std::shared_ptr<JobHealth> job;
  {
    absl::MutexLock lock(&mu_);
    reform_requests_[job_id] = round;
    auto it = jobs_health_.find(job_id);
    if (it == jobs_health_.end() || it->second->round != round) return;
    job = it->second;
  }
  absl::MutexLock lock(&job->mu);
  if (job->reform_requested) return;
  job->reform_requested = true;
  ++job->generation;  // every stream sends it with its next answer
}

void HealthManager::MonitorRunningRounds() {
  for (const v1::JobStatus& job : jobs_->List()) {
    if (job.round() < 1 || (job.state() != v1::JOB_STATE_RUNNING &&
                            job.state() != v1::JOB_STATE_DEGRADED)) {
      continue;
    }
    v1::MemberRef round;
    round.set_job_id(job.config().job_id());
    round.set_round(job.round());
    absl::StatusOr<std::shared_ptr<JobHealth>> started =
        FindOrStart(round, "the coordinator restarted", kRestartGrace);
    if (!started.ok()) {
      GS_LOG(WARNING) << "job '" << job.config().job_id() << "' round "
                      << job.round() << ": not monitored after the restart: "
                      << started.status();
    }
  }
}

absl::Status HealthManager::Resolve(Session* session,
                                    const v1::MemberRef& member) {
  GS_RETURN_IF_ERROR(ValidateMemberRef(member));
  GS_ASSIGN_OR_RETURN(std::shared_ptr<JobHealth> job, FindOrStart(member));
  {
    absl::MutexLock lock(&job->mu);
    if (!job->live()) {
      return absl::AbortedError(RoundOver(job->job_id, job->round));
    }
    if (member.rank() >= static_cast<int>(job->members.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", member.rank(), " is not in round ", job->round, " of job '",
          job->job_id, "' (world size ", job->members.size(), ")"));
    }
    const std::string& expected = job->members[member.rank()].incarnation_id;
    if (expected != member.incarnation_id()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", member.rank(), " of round ", job->round, " of job '",
          job->job_id, "' is process '", expected, "', not '",
          member.incarnation_id(), "': report with your own assignment"));
    }
  }
  session->job = std::move(job);
  session->job_id = member.job_id();
  session->round = member.round();
  session->rank = member.rank();
  session->incarnation_id = member.incarnation_id();
  session->generation_sent = 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> HealthManager::Heartbeat(Session* session,
                                              v1::HeartbeatRequest* request,
                                              v1::HeartbeatResponse* response) {
  absl::StatusOr<bool> answered = HandleHeartbeat(session, request, response);
  ReportQueued();  // a desync fails the job
  return answered;
}

absl::StatusOr<bool> HealthManager::HandleHeartbeat(
    Session* session, v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  const v1::MemberRef& ref = request->member();
  if (session->job == nullptr || ref.rank() != session->rank ||
      ref.round() != session->round || ref.job_id() != session->job_id ||
      ref.incarnation_id() != session->incarnation_id) {
    GS_RETURN_IF_ERROR(Resolve(session, ref));
  }
  GS_RETURN_IF_ERROR(ValidateMetrics(request->metrics()));
  JobHealth* job = session->job.get();
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&job->mu);
  if (!job->live()) {
    return absl::AbortedError(RoundOver(job->job_id, job->round));
  }
  const int factor = job->factor;
  MemberHealth& m = job->members[session->rank];
  const bool same_stream = NoteStreamLocked(job, *session);
  CountLoadLocked(job, m, same_stream, now, factor);
  m.allowed_factor = m.told_factor;  // a change it was told is behind it
  if (!m.heard) job->first_heard_last = now;
  m.heard = true;
  m.last_seen = now;
  m.queue = session->queue;
  m.seen_delay = queue_delays_.Of(m.queue) + job->turn_wait;
  RecordProgressLocked(job, session->rank, request->metrics(), now);
  if (job->detecting()) {
    RecordCollectives(job, session->rank, request->metrics());
    if (request->metrics().has_micro_batches()) {
      job->balancer->Observe(session->rank, request->metrics().step(),
                             request->metrics().micro_batches());
    }
    RecordReadyTimes(job, session->rank, request->metrics());
    RecordFingerprints(job, session->rank, request->metrics(),
                       /*can_heal=*/true);
  }
  m.metrics.Swap(request->mutable_metrics());
  m.metrics.clear_recent_collectives();
  m.metrics.clear_first_bucket_ready();
  m.metrics.clear_replica_fingerprints();
  m.metrics.clear_thread_stacks();
  m.buckets.Swap(m.metrics.mutable_buckets());
  m.metrics.clear_buckets();
  heartbeats_.fetch_add(1, std::memory_order_relaxed);
  return AnswerLocked(job, session, factor, response);
}

bool HealthManager::NoteStreamLocked(JobHealth* job, const Session& session) {
  MemberHealth& m = job->members[session.rank];
  if (m.stream == session.id) return true;
  if (m.stream_broke != absl::InfiniteFuture() &&
      m.state == v1::MEMBER_STATE_ACTIVE) {
    job->reconnected.push_back(session.rank);  // logged by PollJob
  }
  m.stream = session.id;
  m.stream_broke = absl::InfiniteFuture();
  return false;
}

void HealthManager::CountLoadLocked(JobHealth* job, const MemberHealth& m,
                                    bool same_stream, absl::Time now,
                                    int factor) {
  // For the shedder: was this heartbeat handled late after the member's
  // previous one, judged by the interval the member was asked for? The
  // first one on a new stream waited for the reconnection, not for the
  // coordinator.
  HeartbeatShedder::Counts& load = job->load;
  ++load.heartbeats;
  if (!m.heard || !same_stream) return;
  const bool late = now - m.last_seen > job->late_after * m.allowed_factor;
  ++load.samples;
  load.late += late ? 1 : 0;
  if (m.allowed_factor == factor) {
    ++load.current_samples;
    load.current_late += late ? 1 : 0;
  }
}

void HealthManager::RecordProgressLocked(JobHealth* job, int rank,
                                         const v1::WorkerMetrics& in,
                                         absl::Time now) {
  MemberHealth& m = job->members[rank];
  if (in.step() != m.metrics.step() && in.step_timings().step_seconds() > 0) {
    job->hang_timeout->AddStep(
        absl::Seconds(in.step_timings().step_seconds()));
  }
  if (in.last_finished_collective() > m.last_finished) {
    job->last_progress = now;
    ClearHang(job);
  }
  if (in.has_thread_stacks()) job->hang_stacks.Record(rank, in.thread_stacks());
  m.last_started = in.last_started_collective();
  m.last_finished = in.last_finished_collective();
  if (!in.has_round_start() || m.round_start_seen) return;
  m.round_start_seen = true;
  absl::Status recorded =
      jobs_->RecordRoundStart(job->job_id, job->round, in.round_start());
  if (!recorded.ok()) {
    GS_LOG(WARNING) << "job '" << job->job_id << "' round " << job->round
                    << ": could not record rank " << rank
                    << "'s round start: " << recorded;
  }
}

bool HealthManager::AnswerLocked(JobHealth* job, Session* session, int factor,
                                 v1::HeartbeatResponse* response) {
  // Answered on the stream's first heartbeat, when the job changed, and
  // when the shedding factor changed since the member was last told.
  // Also to ask for the member's stacks, once, on a hang verdict.
  MemberHealth& m = job->members[session->rank];
  const bool new_factor = m.told_factor != factor;
  const int64_t stacks = job->hang_stacks.Tell(session->rank);
  if (session->generation_sent == job->generation && !new_factor &&
      stacks == 0) {
    return false;
  }
  session->generation_sent = job->generation;
  if (new_factor) {
    // Its next heartbeat may still come after the older interval.
    m.allowed_factor = std::max(m.told_factor, factor);
    m.told_factor = factor;
  }
  response->set_job_state(job->state);
  response->set_reason(job->reason);
  *response->mutable_heartbeat_interval() =
      ToProtoDuration(job->interval * factor);
  response->set_shedding_load(factor > 1);
  response->set_reform_at_step_boundary(job->reform_requested);
  response->set_stacks_request(stacks);
  return true;
}

void HealthManager::RecordCollectives(JobHealth* job, int rank,
                                      const v1::WorkerMetrics& metrics) {
  for (const v1::CollectiveFingerprint& f : metrics.recent_collectives()) {
    std::optional<std::string> desync = job->desync.Observe(rank, f);
    if (!desync.has_value()) continue;
    job->diagnosis.set_desync(*desync);
    HealthUpdate update;
    update.job_state = v1::JOB_STATE_FAILED;
    update.reason = *std::move(desync);
    Transition(job, std::move(update)).IgnoreError();  // it logs why not
    return;
  }
}

void HealthManager::RecordReadyTimes(JobHealth* job, int rank,
                                     const v1::WorkerMetrics& metrics) {
  for (const v1::StepReady& ready : metrics.first_bucket_ready()) {
    std::optional<std::vector<v1::Straggler>> stragglers =
        job->stragglers->Observe(rank, ready);
    if (!stragglers.has_value()) continue;
    MaybeRebalance(job, *stragglers);
    job->diagnosis.clear_stragglers();
    for (v1::Straggler& s : *stragglers) {
      *job->diagnosis.add_stragglers() = std::move(s);
    }
  }
}

absl::StatusOr<v1::JobState> HealthManager::ReportCompletion(
    const v1::ReportCompletionRequest& request) {
  return ReportCompletions({&request})[0];
}

std::vector<absl::StatusOr<v1::JobState>> HealthManager::ReportCompletions(
    const std::vector<const v1::ReportCompletionRequest*>& requests) {
  std::vector<absl::StatusOr<v1::JobState>> answers(
      requests.size(), absl::UnknownError("not recorded"));
  // The valid ones, by job (in order of first appearance), then rank.
  struct Batch {
    std::shared_ptr<JobHealth> job;
    std::vector<int> ranks;
    std::vector<const v1::ReportCompletionRequest*> requests;
    std::vector<size_t> slots;
  };
  std::vector<Batch> batches;
  for (size_t i = 0; i < requests.size(); ++i) {
    Session session;
    absl::Status checked = CheckCompletion(&session, *requests[i]);
    if (!checked.ok()) {
      answers[i] = checked;
      continue;
    }
    auto batch = std::find_if(batches.begin(), batches.end(),
                              [&](const Batch& b) { return b.job == session.job; });
    if (batch == batches.end()) {
      batches.push_back(Batch{session.job, {}, {}, {}});
      batch = batches.end() - 1;
    }
    batch->ranks.push_back(session.rank);
    batch->requests.push_back(requests[i]);
    batch->slots.push_back(i);
  }
  for (const Batch& batch : batches) {
    RecordCompletions(batch.job.get(), batch.ranks, batch.requests, batch.slots,
                      &answers);
  }
  ReportQueued();
  return answers;
}

absl::Status HealthManager::CheckCompletion(
    Session* session, const v1::ReportCompletionRequest& request) {
  GS_RETURN_IF_ERROR(Resolve(session, request.member()));
  if (request.has_metrics()) GS_RETURN_IF_ERROR(ValidateMetrics(request.metrics()));
  if (request.message().size() > kMaxErrorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("message is at most ", kMaxErrorBytes, " bytes"));
  }
  return absl::OkStatus();
}

void HealthManager::RecordCompletions(
    JobHealth* job, const std::vector<int>& ranks,
    const std::vector<const v1::ReportCompletionRequest*>& requests,
    const std::vector<size_t>& slots,
    std::vector<absl::StatusOr<v1::JobState>>* answers) {
  absl::MutexLock lock(&job->mu);
  const absl::Time now = clock_->Now();
  // Each member's first report of the batch; repeats (of a member that
  // exited before, or twice here) are answered with the job's state.
  std::vector<size_t> firsts;
  std::set<int> seen;
  for (size_t i = 0; i < ranks.size(); ++i) {
    MemberHealth& m = job->members[ranks[i]];
    // A member taken for stopped says so itself: it was not lost.
    m.presumed_stopped = false;
    if (m.state == v1::MEMBER_STATE_EXITED || !seen.insert(ranks[i]).second) {
      continue;
    }
    firsts.push_back(i);
    NoteCompletionLocked(job, ranks[i], *requests[i], now);
  }
  if (!job->detecting()) {
    // The job already ended (or a divergence just failed it).
    for (size_t i : firsts) {
      MemberHealth& m = job->members[ranks[i]];
      if (m.lost_after_end) {  // it was not lost after all
        m.lost_after_end = false;
        RecordAfterTheEnd(job, ranks[i], v1::MEMBER_STATE_EXITED,
                          CompletionText(*requests[i]));
      }
      m.state = v1::MEMBER_STATE_EXITED;
    }
  } else if (!firsts.empty()) {
    HealthUpdate update;
    std::vector<int> succeeded;
    for (size_t i : firsts) {
      AddCompletionLocked(job, ranks[i], *requests[i], &update);
      if (requests[i]->success()) succeeded.push_back(ranks[i]);
    }
    if (update.job_state != v1::JOB_STATE_FAILED &&
        job->succeeded == static_cast<int>(job->members.size())) {
      update.job_state = v1::JOB_STATE_SUCCEEDED;
      update.reason = absl::StrCat("all ", job->members.size(),
                                   " member(s) of round ", job->round,
                                   " succeeded");
    }
    if (!Transition(job, std::move(update)).ok()) {
      // Superseded before this manager's Poll saw it: the members'
      // successes belong to a round that is over, and they must rejoin to
      // finish.
      for (int rank : succeeded) job->members[rank].succeeded = false;
      job->succeeded -= static_cast<int>(succeeded.size());
      job->current = false;
      for (size_t i : firsts) {
        (*answers)[slots[i]] = absl::AbortedError(RoundOver(job->job_id, job->round));
      }
    }
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if ((*answers)[slots[i]].status().code() != absl::StatusCode::kAborted) {
      (*answers)[slots[i]] = job->state;
    }
  }
}

void HealthManager::NoteCompletionLocked(
    JobHealth* job, int rank, const v1::ReportCompletionRequest& request,
    absl::Time now) {
  MemberHealth& m = job->members[rank];
  if (!m.heard) job->first_heard_last = now;
  m.heard = true;
  m.last_seen = now;
  if (!request.has_metrics()) return;
  if (job->detecting()) {
    // The last step's fingerprints come with the completions; the members
    // are leaving, so a divergence now fails the job.
    RecordFingerprints(job, rank, request.metrics(), /*can_heal=*/false);
  }
  m.metrics = request.metrics();
  m.metrics.clear_recent_collectives();
  m.metrics.clear_first_bucket_ready();
  m.metrics.clear_replica_fingerprints();
  m.buckets.Swap(m.metrics.mutable_buckets());
  m.metrics.clear_buckets();
}

void HealthManager::AddCompletionLocked(
    JobHealth* job, int rank, const v1::ReportCompletionRequest& request,
    HealthUpdate* update) {
  MemberHealth& m = job->members[rank];
  std::string how = CompletionText(request);
  if (request.success()) {
    update->members.push_back({rank, v1::MEMBER_STATE_EXITED, std::move(how)});
    m.succeeded = true;
    ++job->succeeded;
    return;
  }
  if (update->job_state != v1::JOB_STATE_FAILED) {  // the first failure
    update->job_state = v1::JOB_STATE_FAILED;
    update->reason = absl::StrCat("rank ", rank, " (", m.host, ") ", how);
  }
  update->members.push_back({rank, v1::MEMBER_STATE_EXITED, std::move(how)});
}

void HealthManager::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  reform_requests_.erase(job_id);
  divergences_by_job_.erase(job_id);
  rebalances_by_job_.erase(job_id);
  auto it = jobs_health_.find(job_id);
  if (it == jobs_health_.end()) return;
  {
    absl::MutexLock job_lock(&it->second->mu);
    it->second->current = false;
  }
  jobs_health_.erase(it);
}

}  // namespace gradsync
