#include "server/kv_manager.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// Waits list at most this many keys, so one call cannot pin the server.
constexpr size_t kMaxWaitKeys = 100000;

std::string StorageKey(const KvScope& scope, const std::string& key) {
  return absl::StrCat(KvRoundPrefix(scope.job_id, scope.round), key);
}

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

KvManager::KvManager(Storage* storage, Clock* clock, const JobManager* jobs,
                     KvLimits limits)
    : storage_(storage), clock_(clock), jobs_(jobs), limits_(limits) {}

void KvManager::OpenRound(const std::string& job_id, int64_t round) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    JobKv& job = jobs_kv_[job_id];
    ResetJobLocked(job_id, &job,
                   absl::StrCat("round ", job.round, " of job '", job_id,
                                "' is over: round ", round,
                                " has closed; rejoin"),
                   &completions);
    job.round = round;
    job.open = true;
  }
  Run(std::move(completions));
}

void KvManager::RetireRound(const std::string& job_id, int64_t round) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    JobKv& job = jobs_kv_[job_id];
    if (round < job.round) return;
    ResetJobLocked(job_id, &job,
                   absl::StrCat("round ", round, " of job '", job_id,
                                "' was superseded by a rejoin; rejoin to get "
                                "the next round"),
                   &completions);
    job.round = round;
    job.open = false;
  }
  Run(std::move(completions));
}

absl::Status KvManager::RestoreRound(const std::string& job_id, int64_t round,
                                     bool open) {
  const std::string job_prefix = absl::StrCat("kv/", job_id, "/");
  const std::string round_prefix = KvRoundPrefix(job_id, round);
  GS_ASSIGN_OR_RETURN(std::vector<Storage::Entry> entries,
                      storage_->Scan(job_prefix, /*keys_only=*/false));
  absl::MutexLock lock(&mu_);
  JobKv& job = jobs_kv_[job_id];
  job = JobKv();
  job.round = round;
  job.open = open;
  for (const auto& [key, value] : entries) {
    if (!open || !absl::StartsWith(key, round_prefix)) {
      GS_RETURN_IF_ERROR(storage_->Delete(key).status());
      continue;
    }
    job.keys += 1;
    job.bytes += static_cast<int64_t>(key.size() - round_prefix.size() +
                                      value.size());
  }
  return absl::OkStatus();
}

void KvManager::ForgetJob(const std::string& job_id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_kv_.find(job_id);
    if (it == jobs_kv_.end()) return;
    ResetJobLocked(job_id, &it->second,
                   absl::StrCat("job '", job_id, "' has ended"), &completions);
    jobs_kv_.erase(it);
  }
  Run(std::move(completions));
}

absl::Status KvManager::Set(const KvScope& scope, const std::string& key,
                            const std::string& value) {
  std::vector<Completion> completions;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
    GS_RETURN_IF_ERROR(CheckKeyLocked(key));
    status = WriteLocked(scope, job, key, value, &completions);
  }
  Run(std::move(completions));
  return status;
}

absl::StatusOr<std::string> KvManager::Get(const KvScope& scope,
                                           const std::string& key) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(CheckScopeLocked(scope).status());
  GS_RETURN_IF_ERROR(CheckKeyLocked(key));
  absl::StatusOr<std::string> value = storage_->Get(StorageKey(scope, key));
  if (absl::IsNotFound(value.status())) {
    return absl::NotFoundError(absl::StrCat("key '", key, "' not found in round ",
                                            scope.round, " of job '",
                                            scope.job_id, "'"));
  }
  return value;
}

absl::StatusOr<int64_t> KvManager::Add(const KvScope& scope,
                                       const std::string& key, int64_t delta) {
  std::vector<Completion> completions;
  absl::StatusOr<int64_t> result;
  {
    absl::MutexLock lock(&mu_);
    GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
    GS_RETURN_IF_ERROR(CheckKeyLocked(key));
    int64_t current = 0;
    absl::StatusOr<std::string> stored = storage_->Get(StorageKey(scope, key));
    if (stored.ok()) {
      if (!absl::SimpleAtoi(*stored, &current)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "key '", key, "' holds a value that is not a decimal counter"));
      }
    } else if (!absl::IsNotFound(stored.status())) {
      return stored.status();
    }
    int64_t next = 0;
    if (__builtin_add_overflow(current, delta, &next)) {
      return absl::OutOfRangeError(absl::StrCat(
          "adding ", delta, " to counter '", key, "' (", current,
          ") overflows 64 bits"));
    }
    absl::Status written =
        WriteLocked(scope, job, key, absl::StrCat(next), &completions);
    if (written.ok()) {
      result = next;
    } else {
      result = written;
    }
  }
  Run(std::move(completions));
  return result;
}

absl::StatusOr<CasResult> KvManager::CompareAndSet(const KvScope& scope,
                                                   const std::string& key,
                                                   const std::string& expected,
                                                   bool expect_absent,
                                                   const std::string& desired) {
  std::vector<Completion> completions;
  absl::StatusOr<CasResult> result;
  {
    absl::MutexLock lock(&mu_);
    GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
    GS_RETURN_IF_ERROR(CheckKeyLocked(key));
    if (expect_absent && !expected.empty()) {
      return absl::InvalidArgumentError(
          "compare-and-set: give either expect_absent or expected, not both");
    }
    absl::StatusOr<std::string> stored = storage_->Get(StorageKey(scope, key));
    if (!stored.ok() && !absl::IsNotFound(stored.status())) {
      return stored.status();
    }
    CasResult cas;
    bool matches = expect_absent ? !stored.ok()
                                 : (stored.ok() && *stored == expected);
    if (matches) {
      GS_RETURN_IF_ERROR(WriteLocked(scope, job, key, desired, &completions));
      cas.swapped = true;
      cas.exists = true;
      cas.value = desired;
    } else {
      cas.exists = stored.ok();
      if (stored.ok()) cas.value = *std::move(stored);
    }
    result = std::move(cas);
  }
  Run(std::move(completions));
  return result;
}

absl::StatusOr<bool> KvManager::Delete(const KvScope& scope,
                                       const std::string& key) {
  absl::MutexLock lock(&mu_);
  GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
  GS_RETURN_IF_ERROR(CheckKeyLocked(key));
  std::string storage_key = StorageKey(scope, key);
  absl::StatusOr<std::string> stored = storage_->Get(storage_key);
  if (!stored.ok()) {
    if (absl::IsNotFound(stored.status())) return false;
    return stored.status();
  }
  GS_ASSIGN_OR_RETURN(bool existed, storage_->Delete(storage_key));
  if (existed) {
    job->keys -= 1;
    job->bytes -= static_cast<int64_t>(key.size() + stored->size());
  }
  return existed;
}

absl::StatusOr<std::vector<Storage::Entry>> KvManager::List(
    const KvScope& scope, const std::string& prefix, bool keys_only) {
  absl::MutexLock lock(&mu_);
  GS_RETURN_IF_ERROR(CheckScopeLocked(scope).status());
  if (static_cast<int64_t>(prefix.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix is ", prefix.size(), " bytes; keys are at most ",
                     limits_.max_key_bytes));
  }
  std::string round_prefix = KvRoundPrefix(scope.job_id, scope.round);
  GS_ASSIGN_OR_RETURN(
      std::vector<Storage::Entry> entries,
      storage_->Scan(absl::StrCat(round_prefix, prefix), keys_only));
  for (Storage::Entry& entry : entries) {
    entry.first.erase(0, round_prefix.size());
  }
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
  if (scope.round < job.round || (scope.round == job.round && !job.open)) {
    return absl::AbortedError(absl::StrCat(
        "round ", scope.round, " of job '", scope.job_id,
        "' is over (latest round: ", job.round, ", ",
        job.open ? "running" : "superseded, the next one is forming",
        "): rejoin to get a new assignment"));
  }
  if (scope.round > job.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", scope.round, " of job '", scope.job_id,
        "' has not closed (latest closed round: ", job.round, ")"));
  }
  return &job;
}

absl::Status KvManager::CheckKeyLocked(const std::string& key) const {
  if (key.empty() || static_cast<int64_t>(key.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key must be 1-", limits_.max_key_bytes, " bytes, got ", key.size()));
  }
  return absl::OkStatus();
}

absl::Status KvManager::WriteLocked(const KvScope& scope, JobKv* job,
                                    const std::string& key,
                                    const std::string& value,
                                    std::vector<Completion>* completions) {
  if (static_cast<int64_t>(value.size()) > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "value for key '", key, "' is ", value.size(),
        " bytes; the limit is ", limits_.max_value_bytes));
  }
  std::string storage_key = StorageKey(scope, key);
  absl::StatusOr<std::string> old = storage_->Get(storage_key);
  if (!old.ok() && !absl::IsNotFound(old.status())) return old.status();
  int64_t key_delta = old.ok() ? 0 : 1;
  int64_t byte_delta = static_cast<int64_t>(value.size()) -
                       (old.ok() ? static_cast<int64_t>(old->size())
                                 : -static_cast<int64_t>(key.size()));
  if (job->keys + key_delta > limits_.max_keys_per_round) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "round ", scope.round, " of job '", scope.job_id, "' holds ",
        job->keys, " keys, the limit: delete keys it no longer needs"));
  }
  if (job->bytes + byte_delta > limits_.max_bytes_per_round) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "round ", scope.round, " of job '", scope.job_id, "' would hold over ",
        limits_.max_bytes_per_round, " bytes: delete keys it no longer needs"));
  }
  GS_RETURN_IF_ERROR(storage_->Put(storage_key, value));
  job->keys += key_delta;
  job->bytes += byte_delta;
  if (key_delta == 1) WakeLocked(scope, job, key, completions);
  return absl::OkStatus();
}

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

void KvManager::ResetJobLocked(const std::string& job_id, JobKv* job,
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
  // Storage errors cannot be reported to anyone here; in-memory storage
  // has none, and stale keys of a dropped round are unreachable anyway.
  (void)storage_->DeletePrefix(absl::StrCat("kv/", job_id, "/"));
  job->keys = 0;
  job->bytes = 0;
  job->waiting_on.clear();
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
  for (const std::string& key : waiter.keys) {
    if (!storage_->Get(StorageKey({waiter.job_id, waiter.round}, key)).ok()) {
      missing.push_back(key);
    }
  }
  return missing;
}

void KvManager::Run(std::vector<Completion> completions) {
  for (auto& [done, status] : completions) done(status);
}

}  // namespace gradsync
