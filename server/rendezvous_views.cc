// RendezvousManager's read side: the processes waiting for a round and the
// spares, for status and metrics (see rendezvous_manager.h).
#include "server/rendezvous_manager.h"

#include "common/job_config.h"

namespace gradsync {

std::pair<int64_t, int64_t> RendezvousManager::CountPending() const {
  absl::MutexLock lock(&mu_);
  std::pair<int64_t, int64_t> counts = {0, 0};
  for (const auto& [id, job] : rendezvous_) {
    (RoundRuns(job->phase) ? counts.second : counts.first) +=
        job->pending.size();
  }
  return counts;
}

std::optional<RoundPhase> RendezvousManager::PhaseOf(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = rendezvous_.find(job_id);
  if (it == rendezvous_.end()) return std::nullopt;
  return it->second->phase;
}

void RendezvousManager::DescribeWaiting(const std::string& job_id,
                                        v1::JobStatus* status) const {
  absl::MutexLock lock(&mu_);
  auto it = rendezvous_.find(job_id);
  if (it == rendezvous_.end()) return;
  const JobRendezvous& job = *it->second;
  for (const Joiner& joiner : job.pending) {
    v1::Member* member =
        RoundRuns(job.phase) ? status->add_spares() : status->add_waiting();
    member->set_rank(-1);
    member->set_local_rank(-1);
    member->set_node_rank(-1);
    *member->mutable_node() = joiner.node;
    member->set_state(RoundRuns(job.phase) ? v1::MEMBER_STATE_SPARE
                                           : v1::MEMBER_STATE_WAITING);
    *member->mutable_last_seen() = ToProtoTime(joiner.join_time);
  }
}

}  // namespace gradsync
