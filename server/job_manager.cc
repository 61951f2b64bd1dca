#include "server/job_manager.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/status_macros.h"
#include "server/job_records.h"

namespace gradsync {
namespace {

std::string DescribeConfig(const v1::JobConfig& c) {
  return absl::StrCat(
      "nodes ", c.min_nodes(), ":", c.max_nodes(), ", nproc_per_node ",
      c.nproc_per_node(), ", join_timeout ",
      absl::FormatDuration(FromProtoDuration(c.join_timeout())),
      ", last_call_timeout ",
      absl::FormatDuration(FromProtoDuration(c.last_call_timeout())),
      ", backend ", BackendName(c.backend()));
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED;
}

JobManager::JobManager(Storage* storage, Clock* clock, JobLimits limits)
    : storage_(storage), clock_(clock), limits_(limits) {}

absl::Status JobManager::LoadFromStorage() {
  GS_ASSIGN_OR_RETURN(std::vector<Storage::Entry> entries,
                      storage_->Scan(kJobRecordsPrefix, /*keys_only=*/false));
  GS_ASSIGN_OR_RETURN(LoadedJobRecords loaded, LoadJobRecords(entries));
  entries.clear();
  // Records of state format 1 are rewritten in parts before anything is
  // served (a change record beside a record with its members inside would
  // not be read back); parts a crash left behind are removed.
  std::vector<Storage::Mutation> batch;
  for (const std::string& id : loaded.inline_members) {
    const v1::JobStatus& record = loaded.records[id];
    AppendStoreWhole(record, record.round(), &batch);
  }
  for (std::string& key : loaded.stale_keys) {
    Storage::Mutation remove;
    remove.kind = Storage::Mutation::Kind::kDelete;
    remove.key = std::move(key);
    batch.push_back(std::move(remove));
  }
  if (!batch.empty()) {
    absl::Status rewritten = storage_->Apply(batch);
    if (!rewritten.ok()) {
      return absl::Status(
          rewritten.code(),
          absl::StrCat("rewriting ", loaded.inline_members.size(),
                       " job records of state format 1 in parts and removing ",
                       loaded.stale_keys.size(), " stale parts: ",
                       rewritten.message()));
    }
  }
  absl::MutexLock lock(&mu_);
  for (auto& [id, record] : loaded.records) {
    auto job = std::make_shared<Job>();
    absl::MutexLock job_lock(&job->mu);
    job->record = std::move(record);
    job->next_change = loaded.next_change[id];
    jobs_[id] = std::move(job);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobStatus> JobManager::Create(const v1::JobConfig& config) {
  GS_ASSIGN_OR_RETURN(v1::JobConfig normalized, NormalizeJobConfig(config));
  absl::MutexLock lock(&mu_);
  if (jobs_.count(normalized.job_id()) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("job '", normalized.job_id(), "' already exists"));
  }
  return CreateLocked(normalized);
}

absl::StatusOr<v1::JobConfig> JobManager::GetOrCreate(
    absl::string_view job_id, const v1::JobConfig* config) {
  GS_RETURN_IF_ERROR(ValidateJobId(job_id));
  v1::JobConfig normalized;
  if (config != nullptr) {
    v1::JobConfig with_id = *config;
    if (with_id.job_id().empty()) with_id.set_job_id(std::string(job_id));
    if (with_id.job_id() != job_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("the request is for job '", job_id,
                       "' but its config names job '", with_id.job_id(), "'"));
    }
    GS_ASSIGN_OR_RETURN(normalized, NormalizeJobConfig(with_id));
  }
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);  // a job is made under the map's lock
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) job = it->second;
    if (job == nullptr && config == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "job '", job_id,
          "' does not exist: create it first or join with its config"));
    }
    if (job == nullptr && !limits_.create_on_join) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job_id,
          "' does not exist, and this coordinator makes jobs only with "
          "`gradsync create` (--create_jobs_on_join=false)"));
    }
    if (job == nullptr) {
      GS_ASSIGN_OR_RETURN(v1::JobStatus created, CreateLocked(normalized));
      return created.config();
    }
  }
  absl::MutexLock lock(&job->mu);
  const v1::JobStatus& record = job->record;
  if (IsTerminal(record.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' has ended (", JobStateName(record.state()),
        record.reason().empty() ? "" : ": ", record.reason(),
        "): start a new job with another id"));
  }
  if (config != nullptr && !SameJobConfig(record.config(), normalized)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' exists with a different config (",
        DescribeConfig(record.config()), "); this join asked for ",
        DescribeConfig(normalized),
        ": use the same settings on every worker or a new job id"));
  }
  return record.config();
}

absl::StatusOr<v1::JobStatus> JobManager::Get(absl::string_view job_id) const {
  v1::JobStatus record;
  GS_RETURN_IF_ERROR(CopyTo(job_id, &record));
  return record;
}

absl::Status JobManager::CopyTo(absl::string_view job_id,
                              v1::JobStatus* out) const {
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  out->CopyFrom(job->record);
  return absl::OkStatus();
}

absl::StatusOr<JobManager::SelectionCounts> JobManager::CopySelected(
    absl::string_view job_id, const MemberSelection& selection,
    v1::JobStatus* out) const {
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  const v1::JobStatus& record = job->record;
  CopyAllButMembers(record, out);
  SelectionCounts counts;
  const int size = record.members_size();
  const int to = selection.rank_to > 0 ? std::min(selection.rank_to, size) : size;
  for (int r = 0; r < size; ++r) {
    const v1::Member& m = record.members(r);
    switch (m.state()) {
      case v1::MEMBER_STATE_ACTIVE: ++counts.active; break;
      case v1::MEMBER_STATE_LOST: ++counts.lost; break;
      case v1::MEMBER_STATE_EXITED: ++counts.exited; break;
      default: break;
    }
    if (r < selection.rank_from || r >= to) continue;
    if (selection.keep && !selection.keep(m)) continue;
    ++counts.matching;
    if (r < selection.page_start) continue;
    if (selection.limit > 0 && out->members_size() == selection.limit) {
      if (counts.next_rank < 0) counts.next_rank = r;
      continue;
    }
    *out->add_members() = m;
  }
  return counts;
}

bool JobManager::Exists(absl::string_view job_id) const {
  absl::ReaderMutexLock lock(&mu_);
  return jobs_.find(job_id) != jobs_.end();
}

void PhaseHistogram::Observe(absl::Duration d) {
  const double seconds = absl::ToDoubleSeconds(d);
  const size_t bucket =
      std::lower_bound(kRecoveryBuckets.begin(), kRecoveryBuckets.end(),
                       seconds) -
      kRecoveryBuckets.begin();
  ++counts[bucket];
  sum += seconds;
  ++count;
}

JobCensus JobManager::Census() const {
  JobCensus census;
  for (const auto& [id, job] : Snapshot()) {
    absl::MutexLock lock(&job->mu);
    const v1::JobStatus& record = job->record;
    ++census.jobs[record.state()];
    for (const v1::Member& m : record.members()) ++census.members[m.state()];
    census.rounds.emplace_back(id, record.round());
    census.recoveries.emplace_back(id, record.recovery_count());
  }
  absl::MutexLock lock(&phases_mu_);
  census.recovery_phases = recovery_phases_;
  return census;
}

std::vector<v1::JobStatus> JobManager::List() const {
  std::vector<v1::JobStatus> out;
  for (const auto& [id, job] : Snapshot()) {
    absl::MutexLock lock(&job->mu);
    out.push_back(WithoutMembers(job->record));
  }
  return out;
}

absl::Status JobManager::RecordRoundClosed(absl::string_view job_id,
                                           int64_t round, v1::Backend backend,
                                           std::vector<v1::Member> members,
                                           const v1::Recovery* recovery) {
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  v1::JobStatus* record = &job->record;
  v1::JobStatus updated = WithoutMembers(*record);
  google::protobuf::Timestamp now = ToProtoTime(clock_->Now());
  updated.set_state(v1::JOB_STATE_RUNNING);
  updated.set_round(round);
  updated.set_world_size(static_cast<int32_t>(members.size()));
  updated.set_backend(backend);
  updated.clear_reason();
  for (v1::Member& m : members) *updated.add_members() = std::move(m);
  *updated.mutable_update_time() = now;
  *updated.mutable_round_close_time() = now;
  if (recovery != nullptr) {
    constexpr int kKeptRecoveries = 16;
    auto* kept = updated.mutable_recoveries();
    if (kept->size() == kKeptRecoveries) kept->DeleteSubrange(0, 1);
    *kept->Add() = *recovery;
    updated.set_recovery_count(updated.recovery_count() + 1);
  }
  std::vector<Storage::Mutation> batch;
  AppendStoreWhole(updated, record->round(), &batch);
  GS_RETURN_IF_ERROR(storage_->Apply(batch));
  *record = std::move(updated);
  job->next_change = 0;
  if (recovery != nullptr) {
    absl::MutexLock phases_lock(&phases_mu_);
    recovery_phases_["detection"].Observe(FromProtoDuration(recovery->detection()));
    recovery_phases_["rendezvous"].Observe(
        FromProtoDuration(recovery->rendezvous()));
  }
  return absl::OkStatus();
}

absl::Status JobManager::RecordRoundSuperseded(absl::string_view job_id,
                                               absl::string_view reason) {
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  const google::protobuf::Timestamp now = ToProtoTime(clock_->Now());
  return UpdateLocked(job.get(), [&](v1::JobStatus* r) {
    r->set_state(v1::JOB_STATE_WAITING);
    r->set_reason(std::string(reason));
    *r->mutable_update_time() = now;
  });
}

absl::Status JobManager::RecordRoundStart(absl::string_view job_id,
                                          int64_t round,
                                          const v1::RoundStartTimings& timings) {
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  const v1::JobStatus* record = &job->record;
  if (record->recoveries_size() == 0 ||
      record->recoveries(record->recoveries_size() - 1).new_round() != round) {
    return absl::OkStatus();
  }
  v1::Recovery* recovery =
      job->record.mutable_recoveries(record->recoveries_size() - 1);
  v1::RoundStartTimings* slowest = recovery->mutable_round_start();
  const auto keep_max = [](const google::protobuf::Duration& d,
                           google::protobuf::Duration* max) {
    if (FromProtoDuration(d) > FromProtoDuration(*max)) *max = d;
  };
  keep_max(timings.process_group(), slowest->mutable_process_group());
  keep_max(timings.state_transfer(), slowest->mutable_state_transfer());
  keep_max(timings.first_step(), slowest->mutable_first_step());
  recovery->set_round_start_reports(recovery->round_start_reports() + 1);
  job->unsaved_round_starts = true;
  absl::MutexLock phases_lock(&phases_mu_);
  recovery_phases_["process_group"].Observe(
      FromProtoDuration(timings.process_group()));
  recovery_phases_["state_transfer"].Observe(
      FromProtoDuration(timings.state_transfer()));
  recovery_phases_["first_step"].Observe(
      FromProtoDuration(timings.first_step()));
  return absl::OkStatus();
}

absl::StatusOr<JobPhase> JobManager::GetPhase(absl::string_view job_id) const {
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  const v1::JobStatus& record = job->record;
  return JobPhase{record.round(), record.state(), record.reason()};
}

absl::StatusOr<RoundMembers> JobManager::GetRoundMembers(
    absl::string_view job_id) const {
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  const v1::JobStatus& record = job->record;
  RoundMembers out;
  out.config = record.config();
  out.phase = JobPhase{record.round(), record.state(), record.reason()};
  out.incarnations.reserve(record.members_size());
  out.hosts.reserve(record.members_size());
  out.states.reserve(record.members_size());
  for (const v1::Member& m : record.members()) {
    out.incarnations.push_back(m.node().incarnation_id());
    out.hosts.push_back(m.node().hostname());
    out.states.push_back(m.state());
  }
  return out;
}

absl::Status JobManager::RecordHealth(absl::string_view job_id, int64_t round,
                                      const HealthUpdate& update) {
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  v1::JobStatus* record = &job->record;
  if (record->round() != round ||
      (record->state() != v1::JOB_STATE_RUNNING &&
       record->state() != v1::JOB_STATE_DEGRADED)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round, " of job '", job_id, "' is not running (job is ",
        JobStateName(record->state()), " in round ", record->round(), ")"));
  }
  return RecordLocked(job.get(), job_id, round, update);
}

absl::Status JobManager::RecordAfterEnd(absl::string_view job_id, int64_t round,
                                        const HealthUpdate& update) {
  if (update.job_state != v1::JOB_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "a change after the job ended changes no job state");
  }
  GS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Find(job_id));
  absl::MutexLock lock(&job->mu);
  const v1::JobStatus& record = job->record;
  if (record.round() != round || !IsTerminal(record.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' did not end in round ", round, " (it is ",
        JobStateName(record.state()), " in round ", record.round(), ")"));
  }
  return RecordLocked(job.get(), job_id, round, update);
}

absl::Status JobManager::RecordLocked(Job* job, absl::string_view job_id,
                                      int64_t round,
                                      const HealthUpdate& update) {
  v1::JobStatus* record = &job->record;
  const absl::Time now = clock_->Now();
  v1::StoredMemberChanges changes;
  *changes.mutable_update_time() = ToProtoTime(now);
  for (const HealthUpdate::MemberChange& change : update.members) {
    if (change.rank < 0 || change.rank >= record->members_size()) continue;
    v1::Member* stored = changes.add_changes();
    stored->set_rank(change.rank);
    stored->set_state(change.state);
    stored->set_state_reason(change.reason);
  }
  const auto change_job = [&](v1::JobStatus* r) {
    r->set_state(update.job_state);
    r->set_reason(update.reason);
    if (IsTerminal(update.job_state)) *r->mutable_end_time() = ToProtoTime(now);
    *r->mutable_update_time() = ToProtoTime(now);
  };
  std::vector<Storage::Mutation> batch;
  AppendStoreChanges(job_id, round, job->next_change, changes, &batch);
  if (update.job_state != v1::JOB_STATE_UNSPECIFIED) {
    v1::JobStatus header = WithoutMembers(*record);
    change_job(&header);
    AppendStoreRecord(header, &batch);
  }
  GS_RETURN_IF_ERROR(storage_->Apply(batch));
  ++job->next_change;
  for (const v1::Member& change : changes.changes()) {
    v1::Member* member = record->mutable_members(change.rank());
    member->set_state(change.state());
    member->set_state_reason(change.state_reason());
  }
  if (update.job_state != v1::JOB_STATE_UNSPECIFIED) {
    change_job(record);
  } else {
    *record->mutable_update_time() = ToProtoTime(now);
  }
  return absl::OkStatus();
}

absl::Status JobManager::SaveRoundStarts() {
  absl::Status first_error;
  for (const auto& [id, job] : Snapshot()) {
    absl::MutexLock lock(&job->mu);
    if (!job->unsaved_round_starts) continue;
    absl::Status saved = UpdateLocked(job.get(), [](v1::JobStatus*) {});
    if (!saved.ok() && first_error.ok()) {
      first_error = absl::Status(
          saved.code(), absl::StrCat("storing the round-start reports of job '",
                                     id, "': ", saved.message()));
    }
  }
  return first_error;
}

std::vector<std::string> JobManager::EndedBefore(absl::Time cutoff) const {
  std::vector<std::string> ended;
  for (const auto& [id, job] : Snapshot()) {
    absl::MutexLock lock(&job->mu);
    if (IsTerminal(job->record.state()) &&
        FromProtoTime(job->record.end_time()) < cutoff) {
      ended.push_back(id);
    }
  }
  return ended;
}

bool JobManager::ForgetIfEndedBefore(absl::string_view job_id,
                                     absl::Time cutoff) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return false;
  const std::shared_ptr<Job> job = it->second;  // outlives job_lock
  absl::MutexLock job_lock(&job->mu);
  const v1::JobStatus& record = job->record;
  if (!IsTerminal(record.state()) ||
      FromProtoTime(record.end_time()) >= cutoff) {
    return false;
  }
  std::vector<Storage::Mutation> batch;
  AppendRemove(it->first, &batch);
  if (!storage_->Apply(batch).ok()) return false;
  jobs_.erase(it);
  return true;
}

absl::Status JobManager::UpdateLocked(
    Job* job, const std::function<void(v1::JobStatus*)>& change) {
  v1::JobStatus header = WithoutMembers(job->record);
  change(&header);
  std::vector<Storage::Mutation> batch;
  AppendStoreRecord(header, &batch);
  GS_RETURN_IF_ERROR(storage_->Apply(batch));
  change(&job->record);
  job->unsaved_round_starts = false;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<JobManager::Job>> JobManager::Find(
    absl::string_view job_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  }
  return it->second;
}

std::vector<std::pair<std::string, std::shared_ptr<JobManager::Job>>>
JobManager::Snapshot() const {
  absl::ReaderMutexLock lock(&mu_);
  return {jobs_.begin(), jobs_.end()};
}

absl::StatusOr<v1::JobStatus> JobManager::CreateLocked(
    const v1::JobConfig& normalized) {
  if (static_cast<int64_t>(jobs_.size()) >= limits_.max_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator holds ", jobs_.size(), " jobs, its limit (--max_jobs=",
        limits_.max_jobs, "): ended jobs are forgotten after --retention"));
  }
  const int64_t world = int64_t{normalized.max_nodes()} *
                        normalized.nproc_per_node();
  if (world > limits_.max_world_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", normalized.job_id(), "' may have ", world, " processes (",
        normalized.max_nodes(), " nodes x ", normalized.nproc_per_node(),
        "), over the limit of ", limits_.max_world_size,
        " (--max_world_size)"));
  }
  v1::JobStatus record;
  *record.mutable_config() = normalized;
  record.set_state(v1::JOB_STATE_WAITING);
  *record.mutable_create_time() = ToProtoTime(clock_->Now());
  *record.mutable_update_time() = record.create_time();
  std::vector<Storage::Mutation> batch;
  AppendStoreRecord(record, &batch);
  GS_RETURN_IF_ERROR(storage_->Apply(batch));
  auto job = std::make_shared<Job>();
  absl::MutexLock job_lock(&job->mu);
  job->record = record;
  jobs_[normalized.job_id()] = std::move(job);
  return record;
}

}  // namespace gradsync
