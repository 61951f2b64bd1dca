// HealthManager's transitions: what a verdict does to the job by its
// failure policy, the record of each change of the job's and its members'
// states, and what the changes tell the rest of the coordinator once the
// round's lock is released (losses, job ends, heals, rebalances; see
// health_manager.h).
#include "server/health_manager.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"

namespace gradsync {

void HealthManager::ApplyPolicy(JobHealth* job, const std::string& what,
                                HealthUpdate* update,
                                std::vector<Loss>* losses) {
  if (job->policy == v1::FAILURE_POLICY_FAIL) {
    update->job_state = v1::JOB_STATE_FAILED;
    update->reason = what;
    return;
  }
  if (job->state == v1::JOB_STATE_RUNNING) {
    update->job_state = v1::JOB_STATE_DEGRADED;
    update->reason =
        absl::StrCat(what, "; the other members must rejoin to form round ",
                     job->round + 1);
  }
  for (const HealthUpdate::MemberChange& change : update->members) {
    losses->push_back(Loss{job->job_id, job->round, change.rank,
                           absl::StrCat("rank ", change.rank, " (",
                                        job->members[change.rank].host,
                                        ") lost: ", change.reason),
                           absl::ZeroDuration()});
  }
}

void HealthManager::ReportLosses(const std::vector<Loss>& losses) {
  if (!on_loss_) return;
  for (const Loss& loss : losses) on_loss_(loss);
}

void HealthManager::ReportQueued() {
  std::vector<JobEnd> ends;
  std::vector<Heal> heals;
  std::vector<Rebalance> rebalances;
  std::vector<std::pair<std::string, v1::Divergence>> found;
  {
    absl::MutexLock lock(&job_ends_mu_);
    ends.swap(job_ends_);
    heals.swap(heals_);
    rebalances.swap(rebalances_);
    found.swap(found_);
  }
  if (!found.empty() || !rebalances.empty()) {
    absl::MutexLock lock(&mu_);
    for (auto& [job_id, divergence] : found) {
      divergences_by_job_[job_id] = std::move(divergence);
    }
    for (const Rebalance& r : rebalances) {
      v1::Rebalance& shown = rebalances_by_job_[r.job_id];
      shown.set_round(r.round);
      *shown.mutable_shares() = {r.shares.begin(), r.shares.end()};
      shown.set_verdict(r.reason);
    }
  }
  if (on_job_ended_) {
    for (const JobEnd& end : ends) {
      on_job_ended_(end.job_id, end.state, end.reason);
    }
  }
  if (on_heal_) {
    for (const Heal& heal : heals) on_heal_(heal);
  }
  if (on_rebalance_) {
    for (const Rebalance& r : rebalances) on_rebalance_(r);
  }
}

absl::Status HealthManager::Transition(JobHealth* job, HealthUpdate update) {
  std::vector<int> stopped;
  if (IsTerminal(update.job_state)) {
    AddBrokenStreams(job, &update);
    stopped = AddStoppedMembers(job, &update);
  }
  absl::Status recorded = jobs_->RecordHealth(job->job_id, job->round, update);
  if (!recorded.ok()) {
    // The round ended meanwhile: superseded (RoundEnded is on its way) or
    // the job finished.
    GS_LOG(INFO) << "job '" << job->job_id << "' round " << job->round
                 << ": not recorded: " << recorded.message();
    return recorded;
  }
  for (int rank : stopped) job->members[rank].presumed_stopped = true;
  constexpr size_t kLoggedChanges = 10;  // a mass loss logs a summary
  for (size_t i = 0; i < update.members.size(); ++i) {
    const HealthUpdate::MemberChange& change = update.members[i];
    job->members[change.rank].state = change.state;
    if (i < kLoggedChanges) {
      const std::string line = absl::StrCat(
          "job '", job->job_id, "' round ", job->round, ": rank ",
          change.rank, " (", job->members[change.rank].host, ") ",
          MemberStateName(change.state), ": ", change.reason);
      // A member that finished well is news, not a warning.
      if (change.state == v1::MEMBER_STATE_EXITED &&
          change.reason == "succeeded") {
        GS_LOG(INFO) << line;
      } else {
        GS_LOG(WARNING) << line;
      }
    }
  }
  if (update.members.size() > kLoggedChanges) {
    GS_LOG(WARNING) << "job '" << job->job_id << "' round " << job->round
                    << ": and " << update.members.size() - kLoggedChanges
                    << " more rank(s) changed state the same way";
  }
  if (update.job_state != v1::JOB_STATE_UNSPECIFIED) {
    job->state = update.job_state;
    job->reason = update.reason;
    ++job->generation;
    const std::string line =
        absl::StrCat("job '", job->job_id, "' ",
                     JobStateName(update.job_state), ": ", update.reason);
    if (update.job_state == v1::JOB_STATE_SUCCEEDED) {
      GS_LOG(INFO) << line;
    } else {
      GS_LOG(WARNING) << line;
    }
    if (IsTerminal(update.job_state)) {
      absl::MutexLock lock(&job_ends_mu_);
      job_ends_.push_back({job->job_id, update.job_state, update.reason});
    }
  }
  return absl::OkStatus();
}

}  // namespace gradsync
