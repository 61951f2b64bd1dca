// RendezvousManager's phase changes and round events: the one place a
// job's RoundPhase changes, the events queued for the listeners and their
// delivery (the ordering contract of round_lifecycle.h), and the ends of a
// job: ended, then forgotten (see rendezvous_manager.h).
#include "server/rendezvous_manager.h"

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "server/join_request.h"

namespace gradsync {

void RendezvousManager::SetPhaseLocked(JobRendezvous* job, RoundPhase to) {
  GS_CHECK(RoundPhaseMayBecome(job->phase, to))
      << "job '" << job->config.job_id() << "': the rendezvous cannot go from "
      << RoundPhaseName(job->phase) << " to " << RoundPhaseName(to);
  job->phase = to;
}

void RendezvousManager::AddEventLocked(RoundEvent::Kind kind,
                                       const JobRendezvous& job,
                                       const std::string& reason) {
  round_events_.push_back({kind, job.config.job_id(), job.round, reason});
}

void RendezvousManager::CancelLastCallLocked(JobRendezvous* job) {
  if (!job->last_call_deadline.has_value()) return;
  last_calls_.erase({*job->last_call_deadline, job->config.job_id()});
  job->last_call_deadline.reset();
}

void RendezvousManager::Finish(std::vector<Completion> completions) {
  {
    absl::MutexLock delivering(&deliver_mu_);
    std::vector<RoundEvent> events;
    {
      absl::MutexLock lock(&mu_);
      events.swap(round_events_);
    }
    for (const RoundEvent& event : events) {
      for (RoundListener* listener : listeners_) listener->OnRoundEvent(event);
    }
  }
  for (auto& [done, result] : completions) done(std::move(result));
}

void RendezvousManager::JobEnded(const std::string& job_id, v1::JobState state,
                                 const std::string& reason) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    JobRendezvous* job = FindLocked(job_id);
    if (job == nullptr) return;
    if (job->phase == RoundPhase::kEnded) return;
    FailPendingLocked(
        job,
        absl::FailedPreconditionError(absl::StrCat(
            "job '", job_id, "' has ended (", JobStateName(state), ": ", reason,
            ") while this process waited to join it; a new run needs a new "
            "job id")),
        &completions);
    SetPhaseLocked(job, RoundPhase::kEnded);
    AddEventLocked(RoundEvent::Kind::kJobEnded, *job,
                   absl::StrCat(JobStateName(state), ": ", reason));
  }
  Finish(std::move(completions));
}

void RendezvousManager::FailPendingLocked(JobRendezvous* job,
                                          const absl::Status& status,
                                          std::vector<Completion>* completions) {
  const std::string& job_id = job->config.job_id();
  while (!job->pending.empty()) {
    GS_LOG(INFO) << "job '" << job_id << "': "
                 << DescribeProcess(job->pending.begin()->node)
                 << " stops waiting: " << status.message();
    completions->emplace_back(RemovePendingLocked(job, job->pending.begin()),
                              status);
  }
  CancelLastCallLocked(job);
}

void RendezvousManager::ForgetJob(const std::string& job_id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    int64_t round = 0;
    auto it = rendezvous_.find(job_id);
    if (it != rendezvous_.end()) {
      round = it->second->round;
      FailPendingLocked(it->second.get(),
                        absl::FailedPreconditionError(absl::StrCat(
                            "job '", job_id, "' has ended: start a new job id")),
                        &completions);
      rendezvous_.erase(it);
    }
    // The other managers may hold a job this one does not (restored ended).
    round_events_.push_back(
        {RoundEvent::Kind::kForgotten, job_id, round, "retention ended"});
  }
  Finish(std::move(completions));
}

}  // namespace gradsync
