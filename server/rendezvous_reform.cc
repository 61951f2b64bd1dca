// RendezvousManager: the re-forms failure detection asks for (see
// rendezvous_manager.h): healing a divergence, and moving an exact global
// batch's micro-batches between ranks.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/rendezvous_manager.h"

namespace gradsync {

void RendezvousManager::HealDivergence(const std::string& job_id,
                                       int64_t round,
                                       const std::vector<int>& ranks,
                                       const std::string& reason) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    JobRendezvous* job = FindLocked(job_id);
    if (job == nullptr) return;
    if (job->round != round || !RoundRuns(job->phase)) return;
    for (int rank : ranks) {
      if (rank < 0 || rank >= static_cast<int>(job->members.size())) continue;
      job->distrusted_sources.insert(job->members[rank].node.incarnation_id());
    }
    SupersedeLocked(job, reason, absl::ZeroDuration());
    MaybeCloseLocked(job, &completions);
  }
  Finish(std::move(completions));
}

void RendezvousManager::Rebalance(const std::string& job_id, int64_t round,
                                  const std::vector<int>& shares,
                                  const std::string& reason) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    JobRendezvous* job = FindLocked(job_id);
    if (job == nullptr) return;
    if (job->round != round || job->phase != RoundPhase::kRunning ||
        shares.size() != job->members.size()) {
      return;
    }
    const int nproc = job->config.nproc_per_node();
    job->shares_by_place.clear();
    for (size_t rank = 0; rank < shares.size(); ++rank) {
      job->shares_by_place[{job->node_of_rank[rank],
                            static_cast<int>(rank) % nproc}] = shares[rank];
    }
    job->reform_reason = absl::StrCat(
        "rebalancing the global batch of round ", round, ": ", reason,
        ": the round re-forms at a step boundary with the new shares");
    GS_LOG(INFO) << "job '" << job_id << "': " << job->reform_reason;
    SetPhaseLocked(job, RoundPhase::kReformRequested);
    AddEventLocked(RoundEvent::Kind::kReformRequested, *job,
                   job->reform_reason);
  }
  Finish(std::move(completions));
}

std::vector<int> RendezvousManager::SharesForLocked(
    JobRendezvous* job, const Placement& placement) {
  if (job->shares_by_place.empty()) return {};
  const int nproc = job->config.nproc_per_node();
  std::vector<int> shares(placement.shape.world_size, 0);
  size_t found = 0;
  for (size_t i = 0; i < placement.nodes.size(); ++i) {
    for (int local = 0; local < nproc; ++local) {
      auto share = job->shares_by_place.find({placement.nodes[i], local});
      if (share == job->shares_by_place.end()) break;
      shares[placement.node_rank[i] * nproc + local] = share->second;
      ++found;
    }
  }
  if (found != job->shares_by_place.size() || found != shares.size()) {
    job->shares_by_place.clear();  // other members: an even division
    return {};
  }
  return shares;
}

}  // namespace gradsync
