// The key-value store workers bootstrap NCCL and Gloo through. Keys live in
// the namespace of one job's round; the rendezvous manager opens a round when
// it closes and retires it when it is superseded, which drops its keys and
// fails its pending waits with ABORTED.
#ifndef GRADSYNC_SERVER_KV_MANAGER_H_
#define GRADSYNC_SERVER_KV_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/job_manager.h"
#include "server/storage/storage.h"

namespace gradsync {

// Which job and round a key-value call acts in.
struct KvScope {
  std::string job_id;
  int64_t round = 0;
};

// Size limits of the store.
struct KvLimits {
  int64_t max_key_bytes = 1024;
  int64_t max_value_bytes = 1 << 20;
  int64_t max_keys_per_round = 1000000;
  int64_t max_bytes_per_round = int64_t{1} << 30;
  absl::Duration max_wait = absl::Hours(1);
};

// Result of CompareAndSet.
struct CasResult {
  bool swapped = false;
  bool exists = false;  // whether the key exists after the call
  std::string value;    // the value stored after the call
};

// Thread-safe. Lock order: may call JobManager while holding its lock, never
// calls the rendezvous manager. Wait callbacks run without the lock held.
// `storage`, `clock` and `jobs` must outlive it.
class KvManager {
 public:
  // Called exactly once with the outcome of a Wait.
  using WaitCallback = std::function<void(absl::Status)>;

  KvManager(Storage* storage, Clock* clock, const JobManager* jobs,
            KvLimits limits = KvLimits());

  // Makes `round` the job's current round: older rounds' keys are dropped
  // and their waits fail with ABORTED.
  void OpenRound(const std::string& job_id, int64_t round);
  // Ends `round` (superseded): its keys are dropped, its waits fail with
  // ABORTED and its calls are refused with ABORTED until a newer round opens.
  void RetireRound(const std::string& job_id, int64_t round);

  // After a restart on durable storage: makes `round` the job's current
  // round again, open or retired as it was, keeping the keys stored for it
  // (and counting them against its limits); keys of other rounds are
  // dropped. Call before serving. Errors are the storage's.
  absl::Status RestoreRound(const std::string& job_id, int64_t round,
                            bool open);

  // Drops every key and wait of `job_id` (the job was forgotten after its
  // retention period); a later job with the same id starts afresh.
  void ForgetJob(const std::string& job_id);

  absl::Status Set(const KvScope& scope, const std::string& key,
                   const std::string& value);
  // NOT_FOUND when `key` does not exist.
  absl::StatusOr<std::string> Get(const KvScope& scope, const std::string& key);
  // Adds `delta` to the decimal counter at `key` (0 when absent).
  absl::StatusOr<int64_t> Add(const KvScope& scope, const std::string& key,
                              int64_t delta);
  // With `expect_absent`, swaps only when `key` does not exist; otherwise
  // only when its value equals `expected`.
  absl::StatusOr<CasResult> CompareAndSet(const KvScope& scope,
                                          const std::string& key,
                                          const std::string& expected,
                                          bool expect_absent,
                                          const std::string& desired);
  // Returns whether `key` existed.
  absl::StatusOr<bool> Delete(const KvScope& scope, const std::string& key);
  absl::StatusOr<std::vector<Storage::Entry>> List(const KvScope& scope,
                                                   const std::string& prefix,
                                                   bool keys_only);

  // Calls `done` once every key in `keys` exists (OK), at `timeout`
  // (DEADLINE_EXCEEDED naming the missing keys; zero means the maximum), when
  // the round ends (ABORTED), or on CancelWait (CANCELLED). `done` may run
  // before Wait returns. Returns a ticket for CancelWait (0 when already done).
  uint64_t Wait(const KvScope& scope, std::vector<std::string> keys,
                absl::Duration timeout, WaitCallback done);
  // Cancels a pending wait; a no-op when it already finished.
  void CancelWait(uint64_t ticket);

  // Fails the waits whose timeout has passed. Called periodically.
  void Poll();

 private:
  struct Waiter {
    std::string job_id;
    int64_t round = 0;
    std::vector<std::string> keys;
    absl::Time deadline;
    WaitCallback done;
  };
  struct JobKv {
    int64_t round = 0;    // latest round opened or retired
    bool open = false;    // whether `round` accepts calls
    int64_t keys = 0;     // keys stored in `round`
    int64_t bytes = 0;    // key + value bytes stored in `round`
    // key -> tickets of the waits that wait for it.
    absl::flat_hash_map<std::string, std::vector<uint64_t>> waiting_on;
  };
  using Completion = std::pair<WaitCallback, absl::Status>;

  // OK when `scope` names the job's open round; the precise error otherwise.
  absl::StatusOr<JobKv*> CheckScopeLocked(const KvScope& scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckKeyLocked(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores key=value in the open round, keeping the size accounting.
  absl::Status WriteLocked(const KvScope& scope, JobKv* job,
                           const std::string& key, const std::string& value,
                           std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the waits on `key` whose keys now all exist.
  void WakeLocked(const KvScope& scope, JobKv* job, const std::string& key,
                  std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the keys of every round of `job_id` and ends its waits.
  void ResetJobLocked(const std::string& job_id, JobKv* job,
                      absl::string_view why,
                      std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWaiterLocked(uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> MissingKeysLocked(const Waiter& waiter) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static void Run(std::vector<Completion> completions);

  Storage* const storage_;
  Clock* const clock_;
  const JobManager* const jobs_;
  const KvLimits limits_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, JobKv> jobs_kv_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // (deadline, ticket) of every pending wait, earliest first.
  std::set<std::pair<absl::Time, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
};

// The storage prefix of a round's keys: "kv/<job>/<round>/".
std::string KvRoundPrefix(absl::string_view job_id, int64_t round);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_KV_MANAGER_H_
