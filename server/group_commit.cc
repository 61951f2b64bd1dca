#include "server/group_commit.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsync {
namespace {

// Failed write ranges remembered for the callers still to learn of them.
constexpr size_t kMaxFailures = 64;

}  // namespace

GroupCommit::GroupCommit(Storage* storage, absl::Mutex* owner_mu,
                         FailureCallback on_failure)
    : storage_(storage),
      owner_mu_(owner_mu),
      on_failure_(std::move(on_failure)),
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
  absl::MutexLock lock(&mu_);
  const uint64_t seq = ++last_seq_;
  queued_.push_back(Queued{seq, job_id, std::move(mutation), std::move(done)});
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
    std::vector<Storage::Mutation> mutations;
    mutations.reserve(batch.size());
    for (const Queued& q : batch) mutations.push_back(q.mutation);
    const absl::Status status = storage_->Apply(mutations);
    std::vector<Queued> failed_after;
    if (!status.ok()) failed_after = FailBatch(batch, status);
    mu_.Lock();
    if (status.ok()) settled_seq_ = std::max(settled_seq_, batch.back().seq);
    const absl::Status outcome = OutcomeLocked(batch.back().seq);
    mu_.Unlock();
    for (std::vector<Queued>* done : {&batch, &failed_after}) {
      for (Queued& q : *done) {
        if (q.done) q.done(outcome);
      }
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

std::vector<GroupCommit::Queued> GroupCommit::FailBatch(
    const std::vector<Queued>& batch, const absl::Status& status) {
  GS_LOG(ERROR) << "storage failed " << batch.size()
                << " write(s): " << status
                << "; they and the writes queued after them fail";
  // The owner's lock keeps writers out until its memory is reloaded.
  absl::MutexLock owner_lock(owner_mu_);
  std::set<std::string> touched;
  for (const Queued& q : batch) touched.insert(q.job_id);
  std::vector<Queued> after;
  {
    absl::MutexLock lock(&mu_);
    for (const Queued& q : queued_) touched.insert(q.job_id);
    after.swap(queued_);
    failures_[last_seq_] = {batch.front().seq,
                            absl::UnavailableError(absl::StrCat(
                                "the coordinator could not store the write: ",
                                status.message()))};
    if (failures_.size() > kMaxFailures) failures_.erase(failures_.begin());
    settled_seq_ = last_seq_;
  }
  on_failure_(touched);
  return after;
}

absl::Status GroupCommit::OutcomeLocked(uint64_t seq) const {
  auto failed = failures_.lower_bound(seq);
  if (failed != failures_.end() && failed->second.first <= seq) {
    return failed->second.second;
  }
  return absl::OkStatus();
}

}  // namespace gradsync
