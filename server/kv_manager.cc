#include "server/kv_manager.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// Waits list at most this many keys, so one call cannot pin the server.
constexpr size_t kMaxWaitKeys = 100000;

std::string MissingKeysText(const std::vector<std::string>& missing) {
  constexpr size_t kShown = 10;
  std::vector<std::string> shown(
      missing.begin(), missing.begin() + std::min(missing.size(), kShown));
  std::string text = absl::StrCat("'", absl::StrJoin(shown, "', '"), "'");
  if (missing.size() > kShown) {
    absl::StrAppend(&text, " and ", missing.size() - kShown, " more");
  }
  return text;
}

}  // namespace

std::string KvRoundPrefix(absl::string_view job_id, int64_t round) {
  return absl::StrCat("kv/", job_id, "/", round, "/");
}

std::string KvRequestPrefix(absl::string_view job_id, int64_t round) {
  return absl::StrCat("kvreq/", job_id, "/", round, "/");
}

KvManager::KvManager(Storage* storage, Clock* clock, const JobManager* jobs,
                     KvLimits limits)
    : storage_(storage),
      clock_(clock),
      jobs_(jobs),
      limits_(limits),
      // A failed commit reloads the jobs it touched, with mu_ held.
      commit_(storage, &mu_,
              [this](const std::set<std::string>& job_ids)
                  ABSL_NO_THREAD_SAFETY_ANALYSIS {
                    ReloadJobsLocked(job_ids);
                  }) {}

KvManager::~KvManager() = default;

void KvManager::OnRoundEvent(const RoundEvent& event) {
  switch (event.kind) {
    case RoundEvent::Kind::kClosed:
      OpenRound(event.job_id, event.round);
      break;
    case RoundEvent::Kind::kSuperseded:
      RetireRound(event.job_id, event.round);
      break;
    case RoundEvent::Kind::kForgotten:
      ForgetJob(event.job_id);
      break;
    case RoundEvent::Kind::kReformRequested:
    case RoundEvent::Kind::kJobEnded:
      break;  // the round's store serves on until it is retired
  }
}

void KvManager::OpenRound(const std::string& job_id, int64_t round) {
  std::vector<Completion> completions;
  uint64_t reset = 0;
  {
    absl::MutexLock lock(&mu_);
    JobKv& job = jobs_kv_[job_id];
    reset = ResetJobLocked(job_id, &job,
                           absl::StrCat("round ", job.round, " of job '",
                                        job_id, "' is over: round ", round,
                                        " has closed; rejoin"),
                           &completions);
    job.round = round;
    job.open = true;
  }
  Run(std::move(completions));
  FinishReset(job_id, reset);
}

void KvManager::RetireRound(const std::string& job_id, int64_t round) {
  std::vector<Completion> completions;
  uint64_t reset = 0;
  {
    absl::MutexLock lock(&mu_);
    JobKv& job = jobs_kv_[job_id];
    if (round < job.round) return;
    reset = ResetJobLocked(job_id, &job,
                           absl::StrCat("round ", round, " of job '", job_id,
                                        "' was superseded by a rejoin; rejoin "
                                        "to get the next round"),
                           &completions);
    job.round = round;
    job.open = false;
  }
  Run(std::move(completions));
  FinishReset(job_id, reset);
}

void KvManager::ForgetJob(const std::string& job_id) {
  std::vector<Completion> completions;
  uint64_t reset = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_kv_.find(job_id);
    if (it == jobs_kv_.end()) return;
    reset = ResetJobLocked(job_id, &it->second,
                           absl::StrCat("job '", job_id, "' has ended"),
                           &completions);
    jobs_kv_.erase(it);
  }
  Run(std::move(completions));
  FinishReset(job_id, reset);
}

absl::StatusOr<std::string> KvManager::Get(const KvScope& scope,
                                           const std::string& key) {
  Value value;
  {
    absl::MutexLock lock(&mu_);
    GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
    GS_RETURN_IF_ERROR(CheckKeyLocked(key));
    auto it = job->entries.find(key);
    if (it == job->entries.end()) {
      return absl::NotFoundError(absl::StrCat("key '", key,
                                              "' not found in round ",
                                              scope.round, " of job '",
                                              scope.job_id, "'"));
    }
    value = it->second;
  }
  // Only a durable value is ever shown.
  GS_RETURN_IF_ERROR(commit_.AwaitDurable(value.seq));
  return std::move(value.data);
}

absl::StatusOr<std::vector<Storage::Entry>> KvManager::List(
    const KvScope& scope, const std::string& prefix, bool keys_only) {
  std::vector<Storage::Entry> entries;
  uint64_t newest = 0;
  {
    absl::MutexLock lock(&mu_);
    GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
    if (static_cast<int64_t>(prefix.size()) > limits_.max_key_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefix is ", prefix.size(), " bytes; keys are at most ",
                       limits_.max_key_bytes));
    }
    for (auto it = job->entries.lower_bound(prefix);
         it != job->entries.end() && absl::StartsWith(it->first, prefix);
         ++it) {
      entries.emplace_back(it->first,
                           keys_only ? std::string() : it->second.data);
      newest = std::max(newest, it->second.seq);
    }
  }
  GS_RETURN_IF_ERROR(commit_.AwaitDurable(newest));
  return entries;
}

uint64_t KvManager::Wait(const KvScope& scope, std::vector<std::string> keys,
                         absl::Duration timeout, WaitCallback done) {
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobKv*> job = CheckScopeLocked(scope);
    error = job.status();
    if (error.ok() && keys.empty()) {
      error = absl::InvalidArgumentError("wait needs at least one key");
    }
    if (error.ok() && keys.size() > kMaxWaitKeys) {
      error = absl::InvalidArgumentError(absl::StrCat(
          "wait names ", keys.size(), " keys; at most ", kMaxWaitKeys));
    }
    for (size_t i = 0; error.ok() && i < keys.size(); ++i) {
      error = CheckKeyLocked(keys[i]);
    }
    if (error.ok() && (timeout < absl::ZeroDuration() ||
                       timeout > limits_.max_wait)) {
      error = absl::InvalidArgumentError(absl::StrCat(
          "wait timeout must be between 0 and ",
          absl::FormatDuration(limits_.max_wait), ", got ",
          absl::FormatDuration(timeout)));
    }
    if (error.ok()) {
      if (timeout == absl::ZeroDuration()) timeout = limits_.max_wait;
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      Waiter waiter{scope.job_id, scope.round, std::move(keys),
                    clock_->Now() + timeout, nullptr};
      std::vector<std::string> missing = MissingKeysLocked(waiter);
      if (!missing.empty()) {
        uint64_t ticket = next_ticket_++;
        (*job)->waiting_on[missing.front()].push_back(ticket);
        deadlines_.emplace(waiter.deadline, ticket);
        waiter.done = std::move(done);
        waiters_.emplace(ticket, std::move(waiter));
        return ticket;
      }
    }
  }
  done(error);
  return 0;
}

void KvManager::CancelWait(uint64_t ticket) {
  WaitCallback done;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(ticket);
    if (it == waiters_.end()) return;
    done = std::move(it->second.done);
    RemoveWaiterLocked(ticket);
  }
  done(absl::CancelledError("the wait was cancelled by its caller"));
}

void KvManager::Poll() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = clock_->Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      uint64_t ticket = deadlines_.begin()->second;
      Waiter& waiter = waiters_.at(ticket);
      std::vector<std::string> missing = MissingKeysLocked(waiter);
      completions.emplace_back(
          std::move(waiter.done),
          absl::DeadlineExceededError(absl::StrCat(
              "waited for ", waiter.keys.size(), " key(s) in round ",
              waiter.round, " of job '", waiter.job_id, "'; still missing: ",
              MissingKeysText(missing),
              ": check that every rank reached this point")));
      RemoveWaiterLocked(ticket);
    }
  }
  Run(std::move(completions));
}

absl::StatusOr<KvManager::JobKv*> KvManager::CheckScopeLocked(
    const KvScope& scope) {
  GS_RETURN_IF_ERROR(ValidateJobId(scope.job_id));
  if (scope.round < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", scope.round,
        " is not a round: use the round of your assignment (>= 1)"));
  }
  auto it = jobs_kv_.find(scope.job_id);
  if (it == jobs_kv_.end()) {
    if (jobs_->Exists(scope.job_id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", scope.job_id, "' has no closed round yet: join it first"));
    }
    return absl::NotFoundError(
        absl::StrCat("job '", scope.job_id, "' not found"));
  }
  JobKv& job = it->second;
  GS_RETURN_IF_ERROR(
      CheckRoundIsLive(scope.job_id, scope.round, job.round, job.open));
  return &job;
}

absl::Status KvManager::CheckKeyLocked(const std::string& key) const {
  if (key.empty() || static_cast<int64_t>(key.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key must be 1-", limits_.max_key_bytes, " bytes, got ", key.size(),
        " (the coordinator's --max_kv_key_bytes)"));
  }
  return absl::OkStatus();
}

void KvManager::WakeKey(const KvScope& scope, const std::string& key) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_kv_.find(scope.job_id);
    if (it != jobs_kv_.end() && it->second.round == scope.round &&
        it->second.open) {
      WakeLocked(scope, &it->second, key, &completions);
    }
  }
  Run(std::move(completions));
}

int64_t KvManager::QueuedWrites() const { return commit_.QueuedWrites(); }

void KvManager::WakeLocked(const KvScope& scope, JobKv* job,
                           const std::string& key,
                           std::vector<Completion>* completions) {
  auto it = job->waiting_on.find(key);
  if (it == job->waiting_on.end()) return;
  std::vector<uint64_t> tickets = std::move(it->second);
  job->waiting_on.erase(it);
  for (uint64_t ticket : tickets) {
    auto waiter = waiters_.find(ticket);
    if (waiter == waiters_.end()) continue;  // finished meanwhile
    std::vector<std::string> missing = MissingKeysLocked(waiter->second);
    if (missing.empty()) {
      completions->emplace_back(std::move(waiter->second.done),
                                absl::OkStatus());
      RemoveWaiterLocked(ticket);
    } else {
      job->waiting_on[missing.front()].push_back(ticket);
    }
  }
}

uint64_t KvManager::ResetJobLocked(const std::string& job_id, JobKv* job,
                                   absl::string_view why,
                                   std::vector<Completion>* completions) {
  std::vector<uint64_t> ended;
  for (const auto& [ticket, waiter] : waiters_) {
    if (waiter.job_id == job_id) ended.push_back(ticket);
  }
  for (uint64_t ticket : ended) {
    completions->emplace_back(std::move(waiters_.at(ticket).done),
                              absl::AbortedError(why));
    RemoveWaiterLocked(ticket);
  }
  job->entries.clear();
  job->applied.clear();
  job->bytes = 0;
  job->waiting_on.clear();
  return commit_.QueueTogether(
      job_id, {{Storage::Mutation::Kind::kDeletePrefix,
                absl::StrCat("kv/", job_id, "/"), ""},
               {Storage::Mutation::Kind::kDeletePrefix,
                absl::StrCat("kvreq/", job_id, "/"), ""}});
}

void KvManager::FinishReset(const std::string& job_id, uint64_t seq) {
  absl::Status status = commit_.AwaitDurable(seq);
  if (!status.ok()) {
    GS_LOG(WARNING) << "job '" << job_id
                    << "': dropping the keys of its old rounds: " << status;
  }
}

void KvManager::RemoveWaiterLocked(uint64_t ticket) {
  auto it = waiters_.find(ticket);
  if (it == waiters_.end()) return;
  deadlines_.erase({it->second.deadline, ticket});
  waiters_.erase(it);
}

std::vector<std::string> KvManager::MissingKeysLocked(
    const Waiter& waiter) const {
  std::vector<std::string> missing;
  const uint64_t settled = commit_.SettledSeq();
  auto job = jobs_kv_.find(waiter.job_id);
  for (const std::string& key : waiter.keys) {
    if (job == jobs_kv_.end()) {
      missing.push_back(key);
      continue;
    }
    auto it = job->second.entries.find(key);
    // A key whose write is not durable yet counts as missing: its writer
    // wakes the wait once it is.
    if (it == job->second.entries.end() || it->second.seq > settled) {
      missing.push_back(key);
    }
  }
  return missing;
}

void KvManager::Run(std::vector<Completion> completions) {
  for (auto& [done, status] : completions) done(status);
}

}  // namespace gradsync
