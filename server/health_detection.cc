// HealthManager's failure detection: broken streams and their reconnect
// grace, the periodic Poll (silent members, superseded rounds, hangs) and the
// transitions it leads to (see health_manager.h).
#include "server/health_manager.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"
#include "common/logging.h"

namespace gradsync {

void HealthManager::StreamBroken(Session* session) {
  if (session->job == nullptr || stopped_.load()) return;
  JobHealth* job = session->job.get();
  std::vector<Loss> losses;
  {
    absl::MutexLock lock(&job->mu);
    MemberHealth& m = job->members[session->rank];
    // A member that never heartbeated on this stream, or did so on a newer
    // one since, lost nothing.
    if (m.stream != session->id) return;
    if (m.presumed_stopped) {
      LostAfterTheEnd(job, session->rank);
      return;
    }
    if (m.state != v1::MEMBER_STATE_ACTIVE) return;
    const std::string who =
        absl::StrCat("rank ", session->rank, " (", m.host, ")");
    if (!job->detecting()) {
      // The round was superseded (or ended) before this member's stream
      // broke: nothing to record, but a re-forming round need not wait.
      if (!job->live() && job->policy != v1::FAILURE_POLICY_FAIL) {
        losses.push_back(Loss{job->job_id, job->round, session->rank,
                              absl::StrCat(who, " lost: ", kStreamBroke),
                              absl::ZeroDuration()});
      }
    } else if (job->reconnect_grace > absl::ZeroDuration()) {
      m.stream_broke = clock_->Now();
      job->broke.push_back(session->rank);  // logged by PollJob
    } else {
      HealthUpdate update;
      update.members.push_back(
          {session->rank, v1::MEMBER_STATE_LOST, std::string(kStreamBroke)});
      ApplyPolicy(job, absl::StrCat(who, " lost: ", kStreamBroke), &update,
                  &losses);
      Transition(job, std::move(update)).IgnoreError();  // it logs why not
    }
  }
  ReportLosses(losses);
  ReportQueued();
}

void HealthManager::AddBrokenStreams(JobHealth* job, HealthUpdate* update) {
  std::vector<int> broken;
  for (size_t r = 0; r < job->members.size(); ++r) {
    const MemberHealth& m = job->members[r];
    if (m.state != v1::MEMBER_STATE_ACTIVE ||
        m.stream_broke == absl::InfiniteFuture()) {
      continue;
    }
    const bool changed = std::any_of(
        update->members.begin(), update->members.end(),
        [r](const HealthUpdate::MemberChange& c) {
          return c.rank == static_cast<int>(r);
        });
    if (changed) continue;
    broken.push_back(static_cast<int>(r));
    update->members.push_back(
        {static_cast<int>(r), v1::MEMBER_STATE_LOST,
         absl::StrCat(kStreamBroke,
                      " and the job ended before it heartbeat again")});
  }
  if (!broken.empty()) {
    absl::StrAppend(&update->reason, " (the heartbeat stream of rank(s) ",
                    FormatRanks(broken), " had broken before)");
  }
}

std::vector<int> HealthManager::AddStoppedMembers(JobHealth* job,
                                                  HealthUpdate* update) {
  std::vector<int> stopped;
  if (update->job_state != v1::JOB_STATE_FAILED) return stopped;
  std::vector<bool> changed(job->members.size());
  for (const HealthUpdate::MemberChange& c : update->members) {
    if (c.rank >= 0 && c.rank < static_cast<int>(changed.size())) {
      changed[c.rank] = true;
    }
  }
  for (size_t r = 0; r < job->members.size(); ++r) {
    if (changed[r] || job->members[r].state != v1::MEMBER_STATE_ACTIVE) {
      continue;
    }
    update->members.push_back({static_cast<int>(r), v1::MEMBER_STATE_EXITED,
                               "stopped: the job failed"});
    stopped.push_back(static_cast<int>(r));
  }
  return stopped;
}

void HealthManager::LostAfterTheEnd(JobHealth* job, int rank) {
  MemberHealth& m = job->members[rank];
  m.presumed_stopped = false;
  m.lost_after_end = RecordAfterTheEnd(
      job, rank, v1::MEMBER_STATE_LOST,
      absl::StrCat(kStreamBroke, " (seen after the job failed)"));
}

bool HealthManager::RecordAfterTheEnd(JobHealth* job, int rank,
                                      v1::MemberState state,
                                      const std::string& reason) {
  HealthUpdate update;
  update.members.push_back({rank, state, reason});
  const absl::Status recorded =
      jobs_->RecordAfterEnd(job->job_id, job->round, update);
  const std::string line =
      absl::StrCat("job '", job->job_id, "' round ", job->round, ": rank ",
                   rank, " (", job->members[rank].host, ") ",
                   MemberStateName(state), " after the job ended: ", reason);
  if (!recorded.ok()) {  // forgotten meanwhile, or storage failed
    GS_LOG(WARNING) << line << ": not recorded: " << recorded.message();
    return false;
  }
  job->members[rank].state = state;
  GS_LOG(WARNING) << line;
  return true;
}

void HealthManager::ReportBrokenStreams(JobHealth* job,
                                        std::vector<Loss>* losses) {
  for (size_t r = 0; r < job->members.size(); ++r) {
    MemberHealth& m = job->members[r];
    if (m.state != v1::MEMBER_STATE_ACTIVE ||
        m.stream_broke == absl::InfiniteFuture()) {
      continue;
    }
    m.stream_broke = absl::InfiniteFuture();
    if (job->policy == v1::FAILURE_POLICY_FAIL) continue;
    losses->push_back(Loss{job->job_id, job->round, static_cast<int>(r),
                           absl::StrCat("rank ", r, " (", m.host,
                                        ") lost: ", kStreamBroke),
                           absl::ZeroDuration()});
  }
}

std::vector<std::shared_ptr<HealthManager::JobHealth>> HealthManager::Snapshot()
    const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::shared_ptr<JobHealth>> jobs;
  jobs.reserve(jobs_health_.size());
  for (const auto& [id, job] : jobs_health_) jobs.push_back(job);
  return jobs;
}

void HealthManager::ReportQueueDelay(
    absl::Duration delay, absl::Span<const absl::Duration> per_queue,
    absl::flat_hash_map<std::string, absl::Duration> turn_waits) {
  queue_delays_.Report(delay, per_queue);
  absl::MutexLock lock(&poll_mu_);
  turn_waits_ = std::move(turn_waits);
}

void HealthManager::Poll() {
  absl::MutexLock poll_lock(&poll_mu_);
  const absl::Time now = clock_->Now();
  std::vector<std::shared_ptr<JobHealth>> ended;
  std::vector<Loss> losses;
  const std::vector<std::shared_ptr<JobHealth>> jobs = Snapshot();
  // First what the heartbeats since the last Poll say about the load, so
  // that detection below already allows for an overload they show.
  HeartbeatShedder::Counts load;
  std::vector<HeartbeatShedder::Counts> counts(jobs.size());
  std::vector<double> rates;
  rates.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    JobHealth* job = jobs[i].get();
    absl::MutexLock lock(&job->mu);
    load += job->load;
    counts[i] = job->load;
    job->load = HeartbeatShedder::Counts();
    rates.push_back(job->full_rate);
    const auto wait = turn_waits_.find(job->job_id);
    job->turn_wait =
        wait != turn_waits_.end() ? wait->second : absl::ZeroDuration();
  }
  polled_.delay = queue_delays_.overall();
  shedder_.Update(now, load, polled_);
  // The slowdown the load needs, shared fairly: a job that floods the
  // coordinator is slowed, not the small jobs beside it.
  const std::vector<int> factors = HeartbeatShedder::FairFactors(
      shedder_.factor(), rates, config_.shedding.max_factor);
  const HeartbeatShedder::Allowances allowed = shedder_.Allowed(now);
  polled_ = HeartbeatShedder::Backlog();
  for (size_t i = 0; i < jobs.size(); ++i) {
    JobHealth* job = jobs[i].get();
    absl::MutexLock lock(&job->mu);
    job->factor = factors[i];
    NoteEpisodeLocked(job, allowed, counts[i]);
    PollJob(job, now, allowed, &losses, &polled_);
    if (!job->current) ended.push_back(jobs[i]);
  }
  ReportLosses(losses);
  ReportQueued();
  if (ended.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<JobHealth>& job : ended) {
    auto it = jobs_health_.find(job->job_id);
    if (it != jobs_health_.end() && it->second == job) jobs_health_.erase(it);
  }
}

void HealthManager::NoteEpisodeLocked(
    JobHealth* job, const HeartbeatShedder::Allowances& allowed,
    const HeartbeatShedder::Counts& counts) {
  if (allowed.all <= absl::ZeroDuration()) {
    job->episode = absl::InfinitePast();
    return;
  }
  if (job->episode != allowed.since) {
    job->episode = allowed.since;
    job->episode_samples = 0;
    job->episode_late = 0;
  }
  job->episode_samples += counts.samples;
  job->episode_late += counts.late;
}

bool HealthManager::KeepsTimeLocked(const JobHealth& job, absl::Time now,
                                    std::string* why_not) {
  if (job.episode_samples == 0 || job.episode_late > 0) {
    if (why_not != nullptr) {
      *why_not = job.episode_samples == 0
                     ? "none of the job's heartbeats since it fell behind "
                       "was judged"
                     : absl::StrCat(job.episode_late, " of the job's ",
                                    job.episode_samples,
                                    " heartbeats since it fell behind came "
                                    "late");
    }
    return false;
  }
  int on_time = 0;
  int overdue = 0;
  for (const MemberHealth& m : job.members) {
    if (m.state != v1::MEMBER_STATE_ACTIVE) continue;
    const int slowdown = std::max(job.factor, m.allowed_factor);
    if (m.heard && m.stream_broke == absl::InfiniteFuture() &&
        now - m.last_seen <= job.late_after * slowdown) {
      ++on_time;
    } else {
      ++overdue;
    }
  }
  if (overdue <= 1 && on_time > 0) return true;
  if (why_not != nullptr) {
    *why_not = on_time == 0
                   ? std::string("none of the job's members is on time")
                   : absl::StrCat(overdue, " of the job's members are overdue "
                                           "at once");
  }
  return false;
}

void HealthManager::PollJob(JobHealth* job, absl::Time now,
                            const HeartbeatShedder::Allowances& allowed,
                            std::vector<Loss>* losses,
                            HeartbeatShedder::Backlog* backlog) {
  // A round the rendezvous superseded (RoundEnded) ends its monitoring.
  // Nothing else changes a monitored round's state behind this manager's
  // back: it records every other transition itself (Transition).
  if (job->superseded.load()) {
    job->current = false;
    ++job->generation;
    ReportBrokenStreams(job, losses);
    return;
  }
  if (!job->detecting()) return;
  LogReconnects(job);
  // Silence allowed: missed intervals at the member's factor, plus the
  // backlog the coordinator knows it has (how long it has been behind, or
  // the longest its queues held heartbeats; for a job that keeps time, only
  // what its queue's delay grew by since the member was last handled), at
  // most missed intervals at the largest factor (see the class comment). A
  // hang verdict waits for that backlog too.
  Silence silence;
  silence.limit = job->interval * job->missed;
  silence.extra =
      std::min(allowed.all, silence.limit * config_.shedding.max_factor);
  silence.kept_time =
      silence.extra > absl::ZeroDuration() && KeepsTimeLocked(*job, now);
  silence.delays = &queue_delays_;
  silence.turn_wait = job->turn_wait;
  if (now < job->not_lost_before) {
    DiagnoseHang(job, now, silence.extra);
    return;
  }
  // Below both bounds a member is neither overdue nor lost (most are).
  silence.quiet = std::min(job->late_after, silence.limit);
  HealthUpdate update;
  int64_t active = 0;
  for (size_t r = 0; r < job->members.size(); ++r) {
    const MemberHealth& m = job->members[r];
    if (m.state != v1::MEMBER_STATE_ACTIVE) continue;
    ++active;
    if (m.heard) ++backlog->members;
    std::optional<std::string> lost =
        LostReasonLocked(*job, m, silence, now, job->factor, backlog);
    if (lost.has_value()) {
      update.members.push_back({static_cast<int>(r), v1::MEMBER_STATE_LOST,
                                *std::move(lost)});
    }
  }
  job->full_rate =
      static_cast<double>(active) / absl::ToDoubleSeconds(job->interval);
  backlog->full_rate += job->full_rate;
  backlog->expected_rate += job->full_rate / job->factor;
  if (!update.members.empty()) {
    RecordLossesLocked(job, std::move(update), now, losses);
  }
  DiagnoseHang(job, now, silence.extra);
}

absl::Duration HealthManager::Silence::Extra(const MemberHealth& m) const {
  const absl::Duration grew = delays->Of(m.queue) + turn_wait - m.seen_delay;
  return kept_time ? std::clamp(grew, absl::ZeroDuration(), extra) : extra;
}

std::optional<std::string> HealthManager::LostReasonLocked(
    const JobHealth& job, const MemberHealth& m, const Silence& silence,
    absl::Time now, int factor, HeartbeatShedder::Backlog* backlog) const {
  const int slowdown = std::max(factor, m.allowed_factor);
  if (m.stream_broke != absl::InfiniteFuture()) {
    // In its reconnect grace: only the grace decides.
    const absl::Duration grace = job.reconnect_grace * slowdown;
    if (now - m.stream_broke <= grace) return std::nullopt;
    return absl::StrCat(kStreamBroke, " and it did not heartbeat again within ",
                        absl::FormatDuration(grace));
  }
  const absl::Duration silent_for = now - m.last_seen;
  if (silent_for <= silence.quiet) return std::nullopt;
  if (m.heard && silent_for > job.late_after * slowdown) ++backlog->overdue;
  if (silent_for <= silence.limit * slowdown + silence.Extra(m)) {
    return std::nullopt;
  }
  // A round still starting: while others are heard for the first time, a
  // member not heard yet may be waiting to be read (a coordinator past its
  // capacity accepts a large round's new streams slowly, where no queue
  // probe sees them). It is waited for until a window passed without a
  // first heartbeat, and at most as long as a silent member can be.
  if (!m.heard && now - job.first_heard_last <= silence.limit * slowdown &&
      silent_for <= silence.limit * config_.shedding.max_factor) {
    return std::nullopt;
  }
  const std::string silent =
      absl::FormatDuration(absl::Trunc(silent_for, absl::Milliseconds(1)));
  const std::string every =
      slowdown == 1
          ? absl::FormatDuration(job.interval)
          : absl::StrCat(absl::FormatDuration(job.interval * slowdown),
                         ": the job's ", absl::FormatDuration(job.interval),
                         " x", slowdown,
                         " while the coordinator sheds heartbeat load");
  std::string reason =
      m.heard ? absl::StrCat("missed ", job.missed, " heartbeats (every ", every,
                             "): last heard ", silent, " ago")
              : absl::StrCat("sent no heartbeat in the ", silent, " since ",
                             job.started_by);
  // Below a millisecond it would read "after 0 more".
  const absl::Duration extra =
      absl::Trunc(silence.Extra(m), absl::Milliseconds(1));
  if (extra <= absl::ZeroDuration()) return reason;
  // Why it took longer than the missed intervals: the coordinator was
  // behind, and what of that this job was given.
  const std::string more = absl::FormatDuration(extra);
  std::string why_not;
  if (silence.kept_time) {
    absl::StrAppend(&reason, ", after ", more,
                    " more for what the delay of its heartbeats grew by (the "
                    "coordinator is behind; this job's heartbeats keep time)");
  } else {
    KeepsTimeLocked(job, now, &why_not);
    absl::StrAppend(&reason, ", after ", more,
                    " more while the coordinator is behind (", why_not, ")");
  }
  return reason;
}

void HealthManager::RecordLossesLocked(JobHealth* job, HealthUpdate update,
                                       absl::Time now,
                                       std::vector<Loss>* losses) {
  const HealthUpdate::MemberChange& first = update.members.front();
  std::string what = absl::StrCat("rank ", first.rank, " (",
                                  job->members[first.rank].host, ") lost: ",
                                  first.reason);
  if (update.members.size() > 1) {
    absl::StrAppend(&what, " (and ", update.members.size() - 1,
                    " more rank(s))");
  }
  const size_t first_loss = losses->size();
  ApplyPolicy(job, what, &update, losses);
  for (size_t i = first_loss; i < losses->size(); ++i) {
    Loss& loss = (*losses)[i];
    loss.detection = now - job->members[loss.rank].last_seen;
  }
  Transition(job, std::move(update)).IgnoreError();  // it logs why not
}

void HealthManager::LogReconnects(JobHealth* job) {
  if (!job->broke.empty()) {
    GS_LOG(INFO) << "job '" << job->job_id << "' round " << job->round
                 << ": the heartbeat stream of rank(s) "
                 << FormatRanks(job->broke)
                 << " broke; each is LOST unless it heartbeats again within "
                 << absl::FormatDuration(job->reconnect_grace);
    job->broke.clear();
  }
  if (!job->reconnected.empty()) {
    GS_LOG(INFO) << "job '" << job->job_id << "' round " << job->round
                 << ": rank(s) " << FormatRanks(job->reconnected)
                 << " heartbeat again on a new stream, inside their grace";
    job->reconnected.clear();
  }
}

void HealthManager::ClearHang(JobHealth* job) {
  job->diagnosis.clear_hang();
  job->hang_stacks.Clear();
}

void HealthManager::AskForStacks(
    JobHealth* job,
    const std::map<std::pair<int64_t, int64_t>, std::vector<int>,
                   std::greater<>>& groups,
    absl::Time now) {
  // The ranks furthest behind, and the first rank furthest ahead for
  // contrast (none when every rank is at the same place). The id need only
  // differ from the previous request's, also across a coordinator restart:
  // the clock's microseconds do.
  const std::vector<int>& behind = groups.rbegin()->second;
  const int ahead = groups.size() > 1 ? groups.begin()->second.front() : -1;
  job->hang_stacks.Ask(absl::ToUnixMicros(now), behind, ahead);
  const auto& asked = job->hang_stacks.view().hung_ranks();
  GS_LOG(INFO) << "job '" << job->job_id << "' round " << job->round
               << ": hang diagnosed; asking rank(s) "
               << FormatRanks(std::vector<int>(asked.begin(), asked.end()))
               << " (behind)"
               << (ahead >= 0 ? absl::StrCat(" and ", ahead, " (ahead)")
                              : std::string())
               << " for the stacks of their threads";
}

absl::Duration HealthManager::HangTimeoutLocked(const JobHealth& job) {
  int slowdown = job.factor;
  for (const MemberHealth& m : job.members) {
    if (m.state == v1::MEMBER_STATE_ACTIVE) {
      slowdown = std::max(slowdown, m.allowed_factor);
    }
  }
  return std::max(job.hang_timeout->value(),
                  job.interval * kHeartbeatsToSeeProgress * slowdown);
}

bool HealthManager::PositionsSettled(const JobHealth& job,
                                     absl::Duration timeout) {
  const absl::Time settled = job.last_progress + timeout / 2;
  for (const MemberHealth& m : job.members) {
    if (m.state == v1::MEMBER_STATE_ACTIVE && m.last_seen < settled) {
      return false;
    }
  }
  return true;
}

void HealthManager::DiagnoseHang(JobHealth* job, absl::Time now,
                                 absl::Duration allowance) {
  const absl::Duration timeout = HangTimeoutLocked(*job);
  if (now - job->last_progress < timeout + allowance) {
    ClearHang(job);
    return;
  }
  // Ranks grouped by (last finished, last started), most advanced first.
  std::map<std::pair<int64_t, int64_t>, std::vector<int>, std::greater<>>
      groups;
  int64_t max_started = 0;
  for (size_t r = 0; r < job->members.size(); ++r) {
    const MemberHealth& m = job->members[r];
    groups[{m.last_finished, m.last_started}].push_back(static_cast<int>(r));
    max_started = std::max(max_started, m.last_started);
  }
  const auto& [only, unused] = *groups.begin();
  if (max_started == 0 || (groups.size() == 1 && only.first == only.second)) {
    ClearHang(job);  // no collective, or all ranks agree
    return;
  }
  if (!job->hang_stacks.asked() && PositionsSettled(*job, timeout)) {
    AskForStacks(job, groups, now);
  }
  std::vector<std::string> parts;
  constexpr size_t kMaxGroups = 4;
  for (const auto& [position, ranks] : groups) {
    if (parts.size() == kMaxGroups) {
      parts.push_back("...");
      break;
    }
    const auto [finished, started] = position;
    const bool one = ranks.size() == 1;
    std::string text = absl::StrCat(one ? "rank " : "ranks ", FormatRanks(ranks));
    const char* number = parts.empty() ? " collective #" : " #";
    if (started > finished) {
      absl::StrAppend(&text, " started", number, started, " and ",
                      one ? "has" : "have", " not finished it");
    } else {
      absl::StrAppend(&text, " finished", number, finished);
      if (finished < max_started) {
        absl::StrAppend(&text, " and ", one ? "has" : "have", " not started #",
                        finished + 1);
      }
    }
    parts.push_back(std::move(text));
  }
  job->diagnosis.set_hang(absl::StrCat(
      absl::StrJoin(parts, "; "), " (no collective finished for ",
      absl::FormatDuration(absl::Trunc(now - job->last_progress,
                                       absl::Milliseconds(100))),
      ")"));
}

}  // namespace gradsync
