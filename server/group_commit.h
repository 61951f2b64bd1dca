// Group commit: writes to Storage queued by many callers and committed in
// batches on one thread, each batch one Storage::Apply, so that concurrent
// writers share a commit (what makes a durable backend fast). Each write
// gets a sequence number when it is queued; it is settled once it and every
// write before it is durable or has failed.
//
// A batch that fails for a reason that may pass (UNAVAILABLE,
// DEADLINE_EXCEEDED, ABORTED: an etcd election, a busy disk) is committed
// again, with backoff, for up to `retry_for`: the writes are whole values,
// so a part that a backend committed before failing is written again
// unchanged, and the callers learn an exact outcome instead of retrying a
// write (an Add) that may have been applied. With etcd, storage unreachable
// that long means the leader's lease has lapsed and the coordinator has
// stopped (EtcdLeadership), so a write either commits or its coordinator is
// gone. When a batch of one job's writes fails, they and that job's writes
// queued after them up to then fail with UNAVAILABLE, and the owner is told
// which jobs' writes failed, with its own lock held, so that it can reload
// what it holds in memory from storage before anyone writes again. A failed
// batch of several jobs' writes is tried again job by job, so that one
// job's refused write (a value over etcd's limit) fails only that job's.
//
// Thread-safe. Lock order: the owner's lock (`owner_mu`) before this
// class's own. Queue must be called with the owner's lock held, so that the
// sequence numbers follow the owner's order of writes. Write callbacks run
// on the committing thread without locks held. `storage` and `owner_mu`
// must outlive it; the destructor commits what is still queued and stops
// the thread.
#ifndef GRADSYNC_SERVER_GROUP_COMMIT_H_
#define GRADSYNC_SERVER_GROUP_COMMIT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/storage/storage.h"

namespace gradsync {

class GroupCommit {
 public:
  // Called exactly once with the outcome of a queued write.
  using WriteCallback = std::function<void(absl::Status)>;
  // Told, on the committing thread with the owner's lock held, the jobs
  // whose queued writes failed.
  using FailureCallback =
      std::function<void(const std::set<std::string>& job_ids)>;

  // How long a batch that fails for a reason that may pass is committed
  // again before its writes fail: longer than the longest etcd leader
  // lease (--etcd_lease_ttl, at most 8 s).
  static constexpr absl::Duration kRetryFor = absl::Seconds(10);

  // Starts the committing thread.
  GroupCommit(Storage* storage, absl::Mutex* owner_mu,
              FailureCallback on_failure, absl::Duration retry_for = kRetryFor);
  ~GroupCommit();
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  // Queues `mutation` of `job_id`, with `done` (may be empty: the writer
  // waits in AwaitDurable) to run once it is committed or failed; returns
  // its sequence number. Call with the owner's lock held.
  uint64_t Queue(const std::string& job_id, Storage::Mutation mutation,
                 WriteCallback done = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `mutations` of `job_id` as one write (one sequence number, one
  // outcome), committed in one transaction on any backend (each but the
  // last is marked with_next).
  uint64_t QueueTogether(const std::string& job_id,
                         std::vector<Storage::Mutation> mutations,
                         WriteCallback done = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns once write `seq` (and every write before it) is durable or has
  // failed; the write's outcome.
  absl::Status AwaitDurable(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);
  // AwaitDurable without the wait: `done` gets the outcome at once (on
  // this thread) when `seq` is settled, else on the committing thread once
  // it is. Without locks held.
  void WhenDurable(uint64_t seq, WriteCallback done) ABSL_LOCKS_EXCLUDED(mu_);

  // Every write up to the one returned is durable or has failed.
  uint64_t SettledSeq() const ABSL_LOCKS_EXCLUDED(mu_);

  // Writes queued and not yet committed (the depth of the queue).
  int64_t QueuedWrites() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    uint64_t seq = 0;
    std::string job_id;
    std::vector<Storage::Mutation> mutations;  // committed together
    WriteCallback done;
  };

  // The committing thread: commits everything queued as one batch, then
  // runs the batch's callbacks, until the destructor stops it.
  void FlushLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool QueuedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queued_.empty() || stopping_;
  }
  // Commits `batch`; returns the jobs whose writes failed, with why (each
  // job's writes again alone when a batch of several jobs' fails).
  std::map<std::string, absl::Status> Commit(const std::vector<Queued>& batch)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The writes of the `failed` jobs failed: fails them and those jobs'
  // writes queued after them (returned, for their callbacks) and tells the
  // owner, under its lock.
  std::vector<Queued> FailJobs(const std::vector<Queued>& batch,
                               const std::map<std::string, absl::Status>& failed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The outcome of write `seq`, known durable or failed.
  absl::Status OutcomeLocked(uint64_t seq) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Applies `mutations`, again with backoff while it fails for a reason
  // that may pass, up to retry_for_.
  absl::Status ApplyRetrying(const std::vector<Storage::Mutation>& mutations);

  Storage* const storage_;
  absl::Mutex* const owner_mu_;
  const FailureCallback on_failure_;
  const absl::Duration retry_for_;

  mutable absl::Mutex mu_;
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;  // of the latest write
  std::vector<Queued> queued_ ABSL_GUARDED_BY(mu_);  // in seq order
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Every write up to this one is durable or has failed.
  uint64_t settled_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Failed writes: seq -> error. The latest kMaxFailures are kept.
  std::map<uint64_t, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  // WhenDurable's callbacks, by the write they wait for.
  std::multimap<uint64_t, WriteCallback> waiters_ ABSL_GUARDED_BY(mu_);
  std::thread flusher_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_GROUP_COMMIT_H_
