// The key-value store workers bootstrap NCCL and Gloo through. Keys live in
// the namespace of one job's round; the store follows the rendezvous's round
// events (a RoundListener): a round's store opens when the round closes and
// is retired when it is superseded, which drops its keys and fails its
// pending waits with ABORTED.
#ifndef GRADSYNC_SERVER_KV_MANAGER_H_
#define GRADSYNC_SERVER_KV_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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
#include "server/group_commit.h"
#include "server/job_manager.h"
#include "server/round_lifecycle.h"
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
  // A job has one live round: these are per job (--max_kv_keys_per_job,
  // --max_kv_bytes_per_job).
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

// Durability: the keys of each job's live round are held in memory, which
// every call reads, and written through to Storage. A write is applied to
// memory under the manager's lock, queued, and answered once storage has
// made it durable; the writes queued meanwhile by other callers go to
// storage in the same batch (Storage::Apply: one commit for all), which is
// what makes a durable backend fast under concurrent writers (GroupCommit,
// server/group_commit.h). Reads are
// answered, and waits completed, only with values that are durable, so
// nothing anyone was told can be lost by a crash. When storage fails a
// batch, every write queued up to then fails with its error and memory is
// reloaded from storage.
//
// (kv_records.cc holds the loading from storage and the request records.)
//
// Thread-safe. Lock order: mu_ before the group commit's; may call
// JobManager while holding mu_, never calls the rendezvous manager. Wait callbacks run
// without locks held. `storage`, `clock` and `jobs` must outlive it.
class KvManager : public RoundListener {
 public:
  // Called exactly once with the outcome of a Wait.
  using WaitCallback = std::function<void(absl::Status)>;
  // Called exactly once with the outcome of a write (SetAsync).
  using WriteCallback = std::function<void(absl::Status)>;
  // Called exactly once with the answer of AddAsync, CompareAndSetAsync,
  // DeleteAsync.
  using AddCallback = std::function<void(absl::StatusOr<int64_t>)>;
  using CasCallback = std::function<void(absl::StatusOr<CasResult>)>;
  using DeleteCallback = std::function<void(absl::StatusOr<bool>)>;

  // Starts the thread that commits queued writes (GroupCommit); the
  // destructor commits what is still queued and stops it.
  KvManager(Storage* storage, Clock* clock, const JobManager* jobs,
            KvLimits limits = KvLimits());
  ~KvManager() override;
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  // Follows the rendezvous: kClosed opens the round's store (OpenRound),
  // kSuperseded retires it (RetireRound), kForgotten drops the job
  // (ForgetJob).
  void OnRoundEvent(const RoundEvent& event) override;

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
  // After a restart, before serving: deletes the stored keys and
  // request-id records of jobs `exists` denies (coordinators before
  // ForgetJob deleted them kept a forgotten job's records for good, and a
  // later job of that id would have found them). Returns how many jobs'
  // were deleted; errors are the storage's.
  absl::StatusOr<int> DropForgottenJobs(
      const std::function<bool(const std::string& job_id)>& exists);

  // Drops every key and wait of `job_id` (the job was forgotten after its
  // retention period); a later job with the same id starts afresh.
  void ForgetJob(const std::string& job_id);

  absl::Status Set(const KvScope& scope, const std::string& key,
                   const std::string& value);
  // Set without blocking the caller: `done` runs with the outcome once the
  // write is durable (on the committing thread, no lock held), or before
  // SetAsync returns for bad input. The gRPC handler uses this, so every
  // call in flight can share a commit.
  void SetAsync(const KvScope& scope, const std::string& key,
                const std::string& value, WriteCallback done);
  // NOT_FOUND when `key` does not exist.
  absl::StatusOr<std::string> Get(const KvScope& scope, const std::string& key);
  // Adds `delta` to the decimal counter at `key` (0 when absent). With a
  // `request_id` (1-64 bytes of letters, digits, '-' and '_'), applied at
  // most once in the round: the id is stored with the write, in the same
  // commit, and an Add with an id the round holds is answered with the
  // value the first one answered, without adding (a client's retry of a
  // call whose answer it lost, also across a restart: RestoreRound).
  // INVALID_ARGUMENT for a bad id, or one that came with another call.
  absl::StatusOr<int64_t> Add(const KvScope& scope, const std::string& key,
                              int64_t delta,
                              const std::string& request_id = "");
  // With `expect_absent`, swaps only when `key` does not exist; otherwise
  // only when its value equals `expected`. With a `request_id` (as for
  // Add), a swap is made at most once: a call with the id of one that
  // swapped answers swapped with `desired` as the value, comparing nothing
  // (a call that did not swap changed nothing and is not remembered).
  absl::StatusOr<CasResult> CompareAndSet(const KvScope& scope,
                                          const std::string& key,
                                          const std::string& expected,
                                          bool expect_absent,
                                          const std::string& desired,
                                          const std::string& request_id = "");
  // Returns whether `key` existed.
  absl::StatusOr<bool> Delete(const KvScope& scope, const std::string& key);
  // Add, CompareAndSet and Delete without the wait: `done` gets the answer
  // once the write it shows is durable (on the committing thread, no lock
  // held), or before the call returns when there is nothing to wait for.
  // The gRPC handlers use these, so that no gRPC thread waits for storage
  // and every call in flight can share a commit.
  void AddAsync(const KvScope& scope, const std::string& key, int64_t delta,
                const std::string& request_id, AddCallback done);
  void CompareAndSetAsync(const KvScope& scope, const std::string& key,
                          const std::string& expected, bool expect_absent,
                          const std::string& desired,
                          const std::string& request_id, CasCallback done);
  void DeleteAsync(const KvScope& scope, const std::string& key,
                   DeleteCallback done);
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

  // Writes applied in memory and waiting for storage to make them durable
  // (the depth of the group-commit queue).
  int64_t QueuedWrites() const;

 private:
  struct Waiter {
    std::string job_id;
    int64_t round = 0;
    std::vector<std::string> keys;
    absl::Time deadline;
    WaitCallback done;
  };
  // A value in memory and the sequence number of the write that stored it
  // (0: read from storage at a restart, durable).
  struct Value {
    std::string data;
    uint64_t seq = 0;
  };
  // A request id's record: the write it came with, and what that answered
  // (stored as RequestRecordText).
  struct Applied {
    bool add = false;    // Add (else a CompareAndSet that swapped)
    std::string key;
    int64_t value = 0;   // Add's answer
    uint64_t seq = 0;    // of the write (0: read from storage, durable)
  };
  struct JobKv {
    int64_t round = 0;    // latest round opened or retired
    bool open = false;    // whether `round` accepts calls
    // The keys of `round` (without the round prefix), when open.
    std::map<std::string, Value, std::less<>> entries;
    // The request ids of `round`'s writes that came with one.
    absl::flat_hash_map<std::string, Applied> applied;
    int64_t bytes = 0;    // key + value bytes stored in `round`, and records
    // key -> tickets of the waits that wait for it.
    absl::flat_hash_map<std::string, std::vector<uint64_t>> waiting_on;
  };
  using Completion = std::pair<WaitCallback, absl::Status>;

  // OK when `scope` names the job's open round; the precise error otherwise.
  absl::StatusOr<JobKv*> CheckScopeLocked(const KvScope& scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckKeyLocked(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores key=value in memory, keeping the size accounting, and queues it
  // for storage with *done (taken only when queued; null: the caller waits
  // in FinishWrite); returns the write's sequence number. With a
  // `request_id`, its record `*applied` is stored in the same commit.
  absl::StatusOr<uint64_t> WriteLocked(const KvScope& scope, JobKv* job,
                                       const std::string& key,
                                       const std::string& value,
                                       WriteCallback* done = nullptr,
                                       const std::string& request_id = "",
                                       const Applied* applied = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A record as stored: "add <value> <key>" or "cas <key>"; nullopt for
  // text that is not one.
  static std::string RecordText(const Applied& applied);
  static std::optional<Applied> ParseRecord(absl::string_view text);
  // The record of `request_id` in `job`'s round, when it holds one;
  // INVALID_ARGUMENT for a bad id or one that came with another kind of
  // call or key.
  absl::StatusOr<const Applied*> FindRequestLocked(const JobKv& job,
                                                   const std::string& request_id,
                                                   bool add,
                                                   const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loads the stored entries of `job`'s round (keys and request records)
  // into memory; `entries` are those under "kv/<job>/" and "kvreq/<job>/";
  // deletes from storage those of other rounds when `drop_others`.
  absl::Status LoadRoundLocked(const std::string& job_id, JobKv* job,
                               std::vector<Storage::Entry> entries,
                               bool drop_others)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `mutation` of `job_id` for storage (commit_), with `done` to run
  // once it is committed; returns its sequence number.
  uint64_t QueueLocked(const std::string& job_id, Storage::Mutation mutation,
                       WriteCallback done = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The locked parts of AddAsync, CompareAndSetAsync and DeleteAsync: the
  // checks, and the write queued. A write queued takes `*done` (then null),
  // called on its commit; otherwise the caller answers with what they set
  // (an Add's retry and a compare-and-set that shows a value: once `*seq`
  // is durable).
  absl::Status AddLocked(const KvScope& scope, const std::string& key,
                         int64_t delta, const std::string& request_id,
                         int64_t* next, uint64_t* retried_seq,
                         AddCallback* done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CompareAndSetLocked(const KvScope& scope,
                                   const std::string& key,
                                   const std::string& expected,
                                   bool expect_absent,
                                   const std::string& desired,
                                   const std::string& request_id,
                                   CasResult* cas, uint64_t* seq,
                                   CasCallback* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeleteLocked(const KvScope& scope, const std::string& key,
                            bool* existed, uint64_t* seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The callback of a write of `key` answering `answer`: once it is
  // durable, completes the waits it was the last missing key of, then
  // calls `done`; its failure goes to `done`.
  template <typename T>
  WriteCallback AnswerOnCommit(const KvScope& scope, const std::string& key,
                               T answer,
                               std::function<void(absl::StatusOr<T>)> done);
  // Completes the waits on `key`, whose write is now durable.
  void WakeKey(const KvScope& scope, const std::string& key)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reloads the open round of `job` from storage.
  void ReloadLocked(const std::string& job_id, JobKv* job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReloadLocked for each of `job_ids` this manager holds (a commit failed).
  void ReloadJobsLocked(const std::set<std::string>& job_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the waits on `key` whose keys now all exist.
  void WakeLocked(const KvScope& scope, JobKv* job, const std::string& key,
                  std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the keys of every round of `job_id` and ends its waits; returns
  // the sequence number of the queued deletion.
  uint64_t ResetJobLocked(const std::string& job_id, JobKv* job,
                          absl::string_view why,
                          std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for a queued reset; its failure can only be logged (stale keys of
  // a dropped round are unreachable, and dropped again at a restart).
  void FinishReset(const std::string& job_id, uint64_t seq);
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
  // Commits the writes (declared last: its thread calls back into the
  // members above until it is destroyed).
  GroupCommit commit_;
};

// The storage prefix of a round's keys: "kv/<job>/<round>/".
std::string KvRoundPrefix(absl::string_view job_id, int64_t round);
// The storage prefix of the records of a round's request ids (Add and
// CompareAndSet with one): "kvreq/<job>/<round>/".
std::string KvRequestPrefix(absl::string_view job_id, int64_t round);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_KV_MANAGER_H_
