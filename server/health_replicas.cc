// HealthManager: what the replicas' reports ask of their round (see
// health_manager.h): a divergence healed or failed, micro-batches moved
// away from a straggler.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "server/health_manager.h"

namespace gradsync {

void HealthManager::RecordFingerprints(JobHealth* job, int rank,
                                       const v1::WorkerMetrics& metrics,
                                       bool can_heal) {
  for (const v1::ReplicaFingerprint& f : metrics.replica_fingerprints()) {
    if (job->healing) return;
    std::optional<DivergenceDetector::Outcome> outcome =
        job->divergence->Observe(rank, f);
    if (!outcome.has_value()) continue;
    if (outcome->divergence.has_value()) {
      OnDivergence(job, *std::move(outcome), can_heal);
      return;
    }
    job->diagnosis.set_replicas_verified_step(
        std::max(job->diagnosis.replicas_verified_step(), outcome->step));
  }
}

void HealthManager::OnDivergence(JobHealth* job,
                                 DivergenceDetector::Outcome outcome,
                                 bool can_heal) {
  v1::Divergence& d = *outcome.divergence;
  d.set_round(job->round);
  divergences_.fetch_add(1, std::memory_order_relaxed);
  // Once a member finished, the round cannot re-form.
  const bool heal = job->heal_divergence && outcome.majority && can_heal &&
                    job->succeeded == 0;
  if (heal) {
    d.set_verdict(absl::StrCat(
        d.verdict(), "; healing: the round re-forms with its state copied "
                     "from a rank of the majority"));
  } else if (!can_heal) {
    d.set_verdict(absl::StrCat(d.verdict(),
                               "; found as the members finished: too late "
                               "to heal, the job fails"));
  } else {
    d.set_verdict(absl::StrCat(
        d.verdict(), outcome.majority ? "; divergence_policy is fail"
                                      : "; the job fails"));
  }
  *job->diagnosis.mutable_divergence() = d;
  GS_LOG(WARNING) << "job '" << job->job_id << "' round " << job->round
                  << ": " << d.verdict();
  {
    absl::MutexLock lock(&job_ends_mu_);
    found_.emplace_back(job->job_id, d);
    if (heal) {
      heals_.push_back({job->job_id, job->round,
                        std::vector<int>(d.ranks().begin(), d.ranks().end()),
                        d.verdict()});
    }
  }
  if (heal) {
    job->healing = true;
    return;
  }
  HealthUpdate update;
  update.job_state = v1::JOB_STATE_FAILED;
  update.reason = d.verdict();
  Transition(job, std::move(update)).IgnoreError();  // it logs why not
}

void HealthManager::MaybeRebalance(
    JobHealth* job, const std::vector<v1::Straggler>& stragglers) {
  if (!job->rebalance || job->rebalancing || job->succeeded > 0 ||
      job->state != v1::JOB_STATE_RUNNING) {
    return;
  }
  std::optional<ShareBalancer::Proposal> proposal =
      job->balancer->Decide(stragglers);
  if (!proposal.has_value()) return;
  job->rebalancing = true;
  GS_LOG(INFO) << "job '" << job->job_id << "' round " << job->round
               << ": rebalancing: " << proposal->verdict;
  absl::MutexLock lock(&job_ends_mu_);
  rebalances_.push_back({job->job_id, job->round, std::move(proposal->shares),
                         std::move(proposal->verdict)});
}

}  // namespace gradsync
