#include "server/group_commit.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsync {
namespace {

// Whether a commit that failed with `status` may succeed if tried again.
bool MayPass(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsAborted(status);
}

// Failed writes remembered for the callers still to learn of them.
constexpr size_t kMaxFailures = 1 << 16;

}  // namespace

GroupCommit::GroupCommit(Storage* storage, absl::Mutex* owner_mu,
                         FailureCallback on_failure, absl::Duration retry_for)
    : storage_(storage),
      owner_mu_(owner_mu),
      on_failure_(std::move(on_failure)),
      retry_for_(retry_for),
      flusher_([this] { FlushLoop(); }) {}

GroupCommit::~GroupCommit() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  flusher_.join();
}

uint64_t GroupCommit::Queue(const std::string& job_id,
                            Storage::Mutation mutation, WriteCallback done) {
  std::vector<Storage::Mutation> mutations;
  mutations.push_back(std::move(mutation));
  return QueueTogether(job_id, std::move(mutations), std::move(done));
}

uint64_t GroupCommit::QueueTogether(const std::string& job_id,
                                    std::vector<Storage::Mutation> mutations,
                                    WriteCallback done) {
  for (size_t i = 0; i < mutations.size(); ++i) {
    mutations[i].with_next = i + 1 < mutations.size();
  }
  absl::MutexLock lock(&mu_);
  const uint64_t seq = ++last_seq_;
  queued_.push_back(
      Queued{seq, job_id, std::move(mutations), std::move(done)});
  return seq;
}

absl::Status GroupCommit::AwaitDurable(uint64_t seq) {
  struct Settled {
    const GroupCommit* commit;
    uint64_t seq;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return commit->settled_seq_ >= seq;
    }
  };
  const Settled settled{this, seq};
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&settled));
  return OutcomeLocked(seq);
}

void GroupCommit::WhenDurable(uint64_t seq, WriteCallback done) {
  absl::Status outcome;
  {
    absl::MutexLock lock(&mu_);
    if (settled_seq_ < seq) {
      waiters_.emplace(seq, std::move(done));
      return;
    }
    outcome = OutcomeLocked(seq);
  }
  done(std::move(outcome));
}

uint64_t GroupCommit::SettledSeq() const {
  absl::MutexLock lock(&mu_);
  return settled_seq_;
}

int64_t GroupCommit::QueuedWrites() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queued_.size());
}

void GroupCommit::FlushLoop() {
  mu_.Lock();
  for (;;) {
    mu_.Await(absl::Condition(this, &GroupCommit::QueuedOrStopping));
    if (queued_.empty()) break;  // stopping, and everything is committed
    std::vector<Queued> batch;
    batch.swap(queued_);
    mu_.Unlock();
    const std::map<std::string, absl::Status> failed = Commit(batch);
    std::vector<Queued> failed_after;
    if (!failed.empty()) failed_after = FailJobs(batch, failed);
    mu_.Lock();
    // Everything before the first write still queued is settled (the
    // failed jobs' writes queued after the batch were taken out).
    settled_seq_ = std::max(
        settled_seq_, queued_.empty() ? last_seq_ : queued_.front().seq - 1);
    std::vector<absl::Status> outcomes;
    for (std::vector<Queued>* done : {&batch, &failed_after}) {
      for (const Queued& q : *done) outcomes.push_back(OutcomeLocked(q.seq));
    }
    // WhenDurable's callbacks of the writes settled now.
    std::vector<std::pair<WriteCallback, absl::Status>> waiting;
    const auto settled_end = waiters_.upper_bound(settled_seq_);
    for (auto it = waiters_.begin(); it != settled_end; ++it) {
      waiting.emplace_back(std::move(it->second), OutcomeLocked(it->first));
    }
    waiters_.erase(waiters_.begin(), settled_end);
    mu_.Unlock();
    size_t i = 0;
    for (std::vector<Queued>* done : {&batch, &failed_after}) {
      for (Queued& q : *done) {
        if (q.done) q.done(outcomes[i]);
        ++i;
      }
    }
    for (auto& [done, outcome] : waiting) done(std::move(outcome));
    mu_.Lock();
  }
  mu_.Unlock();
}

std::map<std::string, absl::Status> GroupCommit::Commit(
    const std::vector<Queued>& batch) {
  std::vector<Storage::Mutation> mutations;
  mutations.reserve(batch.size());
  // Each job's writes, in order (jobs never share a key).
  std::map<std::string, std::vector<Storage::Mutation>> by_job;
  for (const Queued& q : batch) {
    for (const Storage::Mutation& m : q.mutations) {
      mutations.push_back(m);
      by_job[q.job_id].push_back(m);
    }
  }
  const absl::Status status = ApplyRetrying(mutations);
  std::map<std::string, absl::Status> failed;
  if (status.ok()) return failed;
  if (by_job.size() == 1 || MayPass(status)) {
    // One job, or storage unreachable all the while: every job's writes.
    for (const auto& [job_id, writes] : by_job) failed[job_id] = status;
    return failed;
  }
  // One job's refused write (a value over etcd's limit, say) must not fail
  // the others': each job's writes again, alone. Writes are whole values,
  // so a part of the batch that a backend committed before it failed is
  // written again unchanged.
  GS_LOG(WARNING) << "storage failed a batch of " << batch.size()
                  << " write(s) of " << by_job.size() << " jobs: " << status
                  << "; committing each job's writes alone";
  for (const auto& [job_id, writes] : by_job) {
    absl::Status alone = storage_->Apply(writes);
    if (!alone.ok()) failed[job_id] = std::move(alone);
  }
  return failed;
}

absl::Status GroupCommit::ApplyRetrying(
    const std::vector<Storage::Mutation>& mutations) {
  const absl::Time give_up = absl::Now() + retry_for_;
  absl::Duration backoff = absl::Milliseconds(50);
  for (int attempt = 1;; ++attempt) {
    absl::Status status = storage_->Apply(mutations);
    if (status.ok() || !MayPass(status) || absl::Now() + backoff > give_up) {
      if (status.ok() && attempt > 1) {
        GS_LOG(INFO) << "storage committed " << mutations.size()
                     << " write(s) at attempt " << attempt;
      }
      return status;
    }
    if (attempt == 1) {
      GS_LOG(WARNING) << "storage failed " << mutations.size()
                      << " write(s): " << status << "; committing them again "
                      << "for up to " << absl::FormatDuration(retry_for_);
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

std::vector<GroupCommit::Queued> GroupCommit::FailJobs(
    const std::vector<Queued>& batch,
    const std::map<std::string, absl::Status>& failed) {
  for (const auto& [job_id, status] : failed) {
    GS_LOG(ERROR) << "storage failed the writes of job '" << job_id
                  << "': " << status
                  << "; they and the job's writes queued after them fail";
  }
  // The owner's lock keeps writers out until its memory is reloaded.
  absl::MutexLock owner_lock(owner_mu_);
  std::set<std::string> touched;
  for (const auto& [job_id, status] : failed) touched.insert(job_id);
  std::vector<Queued> after;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Queued> kept;
    for (Queued& q : queued_) {
      (touched.count(q.job_id) > 0 ? after : kept).push_back(std::move(q));
    }
    queued_.swap(kept);
    const auto fail = [&](const Queued& q) {
      auto it = failed.find(q.job_id);
      if (it == failed.end()) return;
      failures_[q.seq] = absl::UnavailableError(absl::StrCat(
          "the coordinator could not store the write: ", it->second.message()));
    };
    for (const Queued& q : batch) fail(q);
    for (const Queued& q : after) fail(q);
    while (failures_.size() > kMaxFailures) failures_.erase(failures_.begin());
  }
  on_failure_(touched);
  return after;
}

absl::Status GroupCommit::OutcomeLocked(uint64_t seq) const {
  auto failed = failures_.find(seq);
  return failed == failures_.end() ? absl::OkStatus() : failed->second;
}

}  // namespace gradsync
