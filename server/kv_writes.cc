// KvManager's writes (kv_manager.h): Set, Add, CompareAndSet and Delete,
// each answered once its write is durable (the async forms from the
// committing thread, the sync ones waiting for them), and how a write is
// checked and queued for storage.
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "server/kv_manager.h"

namespace gradsync {
namespace {

std::string StorageKey(const KvScope& scope, const std::string& key) {
  return absl::StrCat(KvRoundPrefix(scope.job_id, scope.round), key);
}

}  // namespace

absl::Status KvManager::Set(const KvScope& scope, const std::string& key,
                            const std::string& value) {
  absl::Notification done;
  absl::Status status;
  SetAsync(scope, key, value, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

void KvManager::SetAsync(const KvScope& scope, const std::string& key,
                         const std::string& value, WriteCallback done) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobKv*> job = CheckScopeLocked(scope);
    refused = job.status();
    if (refused.ok()) refused = CheckKeyLocked(key);
    if (refused.ok()) {
      // Waits on the key complete before the caller hears of the write.
      WriteCallback on_commit = [this, scope, key, done](absl::Status status) {
        if (status.ok()) WakeKey(scope, key);
        done(std::move(status));
      };
      absl::StatusOr<uint64_t> queued =
          WriteLocked(scope, *job, key, value, &on_commit);
      if (queued.ok()) return;
      refused = queued.status();
    }
  }
  done(std::move(refused));
}

namespace {

// The answer of an asynchronous call, waited for.
template <typename T, typename Start>
absl::StatusOr<T> AwaitAnswer(Start start) {
  absl::Notification done;
  absl::StatusOr<T> answer = absl::UnknownError("no answer");
  start([&](absl::StatusOr<T> a) {
    answer = std::move(a);
    done.Notify();
  });
  done.WaitForNotification();
  return answer;
}

}  // namespace

absl::StatusOr<int64_t> KvManager::Add(const KvScope& scope,
                                       const std::string& key, int64_t delta,
                                       const std::string& request_id) {
  return AwaitAnswer<int64_t>([&](AddCallback done) {
    AddAsync(scope, key, delta, request_id, std::move(done));
  });
}

void KvManager::AddAsync(const KvScope& scope, const std::string& key,
                         int64_t delta, const std::string& request_id,
                         AddCallback done) {
  absl::Status refused;
  uint64_t retried_seq = 0;  // of the first call's write, for a retry
  int64_t next = 0;
  {
    absl::MutexLock lock(&mu_);
    refused = AddLocked(scope, key, delta, request_id, &next, &retried_seq,
                        &done);
    if (refused.ok() && done == nullptr) return;  // queued with its write
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  // A retry: answered as the first was, once its write is durable (or
  // with its failure, which dropped the record too).
  commit_.WhenDurable(retried_seq, [next, done](absl::Status status) {
    done(status.ok() ? absl::StatusOr<int64_t>(next) : status);
  });
}

absl::Status KvManager::AddLocked(const KvScope& scope, const std::string& key,
                                  int64_t delta, const std::string& request_id,
                                  int64_t* next, uint64_t* retried_seq,
                                  AddCallback* done) {
  GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
  GS_RETURN_IF_ERROR(CheckKeyLocked(key));
  GS_ASSIGN_OR_RETURN(const Applied* applied,
                      FindRequestLocked(*job, request_id, /*add=*/true, key));
  if (applied != nullptr) {
    *retried_seq = applied->seq;
    *next = applied->value;
    return absl::OkStatus();
  }
  int64_t current = 0;
  auto it = job->entries.find(key);
  if (it != job->entries.end() && !absl::SimpleAtoi(it->second.data, &current)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key '", key, "' holds a value that is not a decimal counter"));
  }
  if (__builtin_add_overflow(current, delta, next)) {
    return absl::OutOfRangeError(absl::StrCat("adding ", delta, " to counter '",
                                              key, "' (", current,
                                              ") overflows 64 bits"));
  }
  const Applied record{true, key, *next, 0};
  WriteCallback on_commit = AnswerOnCommit(scope, key, *next, *done);
  GS_RETURN_IF_ERROR(WriteLocked(scope, job, key, absl::StrCat(*next),
                                 &on_commit, request_id, &record)
                         .status());
  *done = nullptr;  // answered with the write
  return absl::OkStatus();
}

absl::StatusOr<CasResult> KvManager::CompareAndSet(const KvScope& scope,
                                                   const std::string& key,
                                                   const std::string& expected,
                                                   bool expect_absent,
                                                   const std::string& desired,
                                                   const std::string& request_id) {
  return AwaitAnswer<CasResult>([&](CasCallback done) {
    CompareAndSetAsync(scope, key, expected, expect_absent, desired, request_id,
                       std::move(done));
  });
}

void KvManager::CompareAndSetAsync(const KvScope& scope, const std::string& key,
                                   const std::string& expected,
                                   bool expect_absent,
                                   const std::string& desired,
                                   const std::string& request_id,
                                   CasCallback done) {
  if (expect_absent && !expected.empty()) {
    done(absl::InvalidArgumentError(
        "compare-and-set: give either expect_absent or expected, not both"));
    return;
  }
  CasResult cas;
  uint64_t seq = 0;  // the write the answer waits for
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    refused = CompareAndSetLocked(scope, key, expected, expect_absent, desired,
                                  request_id, &cas, &seq, &done);
    if (refused.ok() && done == nullptr) return;  // queued with its write
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  // A retry of a swap, or no swap: answered once the value shown is durable.
  commit_.WhenDurable(seq, [cas, done](absl::Status status) {
    done(status.ok() ? absl::StatusOr<CasResult>(cas) : status);
  });
}

absl::Status KvManager::CompareAndSetLocked(
    const KvScope& scope, const std::string& key, const std::string& expected,
    bool expect_absent, const std::string& desired,
    const std::string& request_id, CasResult* cas, uint64_t* seq,
    CasCallback* done) {
  GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
  GS_RETURN_IF_ERROR(CheckKeyLocked(key));
  GS_ASSIGN_OR_RETURN(const Applied* applied,
                      FindRequestLocked(*job, request_id, /*add=*/false, key));
  auto it = job->entries.find(key);
  const bool exists = it != job->entries.end();
  if (applied != nullptr) {  // a retry of a swap: answered as it was
    *seq = applied->seq;
    *cas = CasResult{true, true, desired};
    return absl::OkStatus();
  }
  if (!(expect_absent ? !exists : (exists && it->second.data == expected))) {
    cas->exists = exists;
    if (exists) {
      cas->value = it->second.data;
      *seq = it->second.seq;  // shown only once durable
    }
    return absl::OkStatus();
  }
  *cas = CasResult{true, true, desired};
  const Applied record{false, key, 0, 0};
  WriteCallback on_commit = AnswerOnCommit(scope, key, *cas, *done);
  GS_RETURN_IF_ERROR(
      WriteLocked(scope, job, key, desired, &on_commit, request_id, &record)
          .status());
  *done = nullptr;  // answered with the write
  return absl::OkStatus();
}

absl::StatusOr<bool> KvManager::Delete(const KvScope& scope,
                                       const std::string& key) {
  return AwaitAnswer<bool>([&](DeleteCallback done) {
    DeleteAsync(scope, key, std::move(done));
  });
}

void KvManager::DeleteAsync(const KvScope& scope, const std::string& key,
                            DeleteCallback done) {
  absl::Status refused;
  bool existed = false;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    refused = DeleteLocked(scope, key, &existed, &seq);
  }
  if (!refused.ok() || !existed) {
    done(refused.ok() ? absl::StatusOr<bool>(false) : refused);
    return;
  }
  commit_.WhenDurable(seq, [done](absl::Status status) {
    done(status.ok() ? absl::StatusOr<bool>(true) : status);
  });
}

absl::StatusOr<uint64_t> KvManager::WriteLocked(const KvScope& scope,
                                                JobKv* job,
                                                const std::string& key,
                                                const std::string& value,
                                                WriteCallback* done,
                                                const std::string& request_id,
                                                const Applied* applied) {
  if (static_cast<int64_t>(value.size()) > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "value for key '", key, "' is ", value.size(),
        " bytes; the limit is ", limits_.max_value_bytes,
        " (the coordinator's --max_kv_value_bytes)"));
  }
  auto old = job->entries.find(key);
  const bool exists = old != job->entries.end();
  std::vector<Storage::Mutation> mutations;
  mutations.push_back(
      {Storage::Mutation::Kind::kPut, StorageKey(scope, key), value});
  if (!request_id.empty()) {
    mutations.push_back(
        {Storage::Mutation::Kind::kPut,
         absl::StrCat(KvRequestPrefix(scope.job_id, scope.round), request_id),
         RecordText(*applied)});
  }
  int64_t byte_delta =
      static_cast<int64_t>(value.size()) -
      (exists ? static_cast<int64_t>(old->second.data.size())
              : -static_cast<int64_t>(key.size()));
  if (mutations.size() > 1) {
    byte_delta += static_cast<int64_t>(mutations[1].key.size() +
                                       mutations[1].value.size());
  }
  if (!exists &&
      static_cast<int64_t>(job->entries.size()) >= limits_.max_keys_per_round) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "round ", scope.round, " of job '", scope.job_id, "' holds ",
        job->entries.size(), " keys, the limit (--max_kv_keys_per_job): "
        "delete keys it no longer needs"));
  }
  if (job->bytes + byte_delta > limits_.max_bytes_per_round) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "round ", scope.round, " of job '", scope.job_id, "' would hold over ",
        limits_.max_bytes_per_round,
        " bytes, the limit (--max_kv_bytes_per_job): delete keys it no longer "
        "needs"));
  }
  // The write and its request's record in one commit.
  const uint64_t seq = commit_.QueueTogether(
      scope.job_id, std::move(mutations),
      done != nullptr ? std::move(*done) : nullptr);
  job->entries[key] = Value{value, seq};
  if (!request_id.empty()) {
    Applied& record = job->applied[request_id];
    record = *applied;
    record.seq = seq;
  }
  job->bytes += byte_delta;
  return seq;
}

uint64_t KvManager::QueueLocked(const std::string& job_id,
                                Storage::Mutation mutation,
                                WriteCallback done) {
  return commit_.Queue(job_id, std::move(mutation), std::move(done));
}

absl::Status KvManager::DeleteLocked(const KvScope& scope,
                                     const std::string& key, bool* existed,
                                     uint64_t* seq) {
  GS_ASSIGN_OR_RETURN(JobKv * job, CheckScopeLocked(scope));
  GS_RETURN_IF_ERROR(CheckKeyLocked(key));
  auto it = job->entries.find(key);
  if (it == job->entries.end()) return absl::OkStatus();
  *existed = true;
  job->bytes -= static_cast<int64_t>(key.size() + it->second.data.size());
  job->entries.erase(it);
  *seq = QueueLocked(scope.job_id, {Storage::Mutation::Kind::kDelete,
                                    StorageKey(scope, key), ""});
  return absl::OkStatus();
}

template <typename T>
KvManager::WriteCallback KvManager::AnswerOnCommit(
    const KvScope& scope, const std::string& key, T answer,
    std::function<void(absl::StatusOr<T>)> done) {
  return [this, scope, key, answer = std::move(answer),
          done = std::move(done)](absl::Status status) {
    if (!status.ok()) {
      done(status);
      return;
    }
    WakeKey(scope, key);  // waits on the key complete first
    done(answer);
  };
}

}  // namespace gradsync
