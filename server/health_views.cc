// HealthManager's read side: what status, the summary, the status page and
// Prometheus show of the monitored rounds (see health_manager.h).
#include "server/health_manager.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"
#include "common/logging.h"

namespace gradsync {

std::string FormatRanks(const std::vector<int>& ranks, size_t max_items) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> items;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (items.size() == max_items) {
      items.push_back("...");
      break;
    }
    if (j - i >= 3) {
      items.push_back(absl::StrCat(sorted[i], "-", sorted[j]));
      i = j + 1;
    } else {
      items.push_back(absl::StrCat(sorted[i]));
      ++i;
    }
  }
  return absl::StrJoin(items, ",");
}

void HealthManager::Describe(v1::JobStatus* status, bool with_buckets) const {
  std::shared_ptr<JobHealth> job;
  std::optional<v1::Divergence> divergence;
  std::optional<v1::Rebalance> rebalance;
  {
    absl::ReaderMutexLock lock(&mu_);
    const std::string& job_id = status->config().job_id();
    auto found = divergences_by_job_.find(job_id);
    if (found != divergences_by_job_.end()) divergence = found->second;
    auto balanced = rebalances_by_job_.find(job_id);
    if (balanced != rebalances_by_job_.end()) rebalance = balanced->second;
    auto it = jobs_health_.find(job_id);
    if (it != jobs_health_.end()) job = it->second;
  }
  // The job's, whichever round is monitored (a heal or a rebalance
  // re-forms the round it was found in).
  const auto add_job_level = [&] {
    if (divergence.has_value()) {
      *status->mutable_diagnosis()->mutable_divergence() = *divergence;
    }
    if (rebalance.has_value()) {
      *status->mutable_diagnosis()->mutable_rebalance() = *rebalance;
    }
  };
  if (job == nullptr || job->round != status->round()) {
    add_job_level();
    return;
  }
  absl::MutexLock lock(&job->mu);
  for (v1::Member& member : *status->mutable_members()) {
    const int r = member.rank();
    if (r < 0 || r >= static_cast<int>(job->members.size())) continue;
    const MemberHealth& m = job->members[r];
    v1::Member* out = &member;
    if (m.heard) {
      *out->mutable_last_seen() = ToProtoTime(m.last_seen);
      out->mutable_metrics()->CopyFrom(m.metrics);
      if (with_buckets) *out->mutable_metrics()->mutable_buckets() = m.buckets;
      // A node agent's process: its own pid, not the agent's that joined.
      if (m.metrics.pid() > 0) out->mutable_node()->set_pid(m.metrics.pid());
    }
    const absl::Duration lag = job->stragglers->lag(r);
    if (lag > absl::ZeroDuration()) *out->mutable_lag() = ToProtoDuration(lag);
    if (m.state == v1::MEMBER_STATE_ACTIVE &&
        m.stream_broke != absl::InfiniteFuture()) {
      out->set_state_reason(absl::StrCat(
          kStreamBroke, " at ",
          absl::FormatTime("%H:%M:%E3S UTC", m.stream_broke,
                           absl::UTCTimeZone()),
          ": LOST unless it heartbeats again within ",
          absl::FormatDuration(job->reconnect_grace)));
    }
  }
  *status->mutable_diagnosis() = job->diagnosis;
  if (job->hang_stacks.asked()) {
    *status->mutable_diagnosis()->mutable_hang_stacks() = job->hang_stacks.view();
  }
  *status->mutable_diagnosis()->mutable_hang_timeout() =
      ToProtoDuration(HangTimeoutLocked(*job));
  status->mutable_diagnosis()->set_hang_timeout_self_set(
      job->hang_timeout->self_set());
  add_job_level();
  status->mutable_diagnosis()->set_overload(
      OverloadText(shedder_.state(), job->factor, job->interval, job->missed));
}

std::string HealthManager::OverloadText(const HeartbeatShedder::State& state,
                                        int factor, absl::Duration interval,
                                        int missed) const {
  // Kept stable while the state is (watchers are sent what changes).
  if (factor > 1) {
    return absl::StrCat(
        "the coordinator is past its heartbeat capacity and sheds load "
        "(since ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", state.shedding_since,
                         absl::UTCTimeZone()),
        "): it asks for heartbeats every ",
        absl::FormatDuration(interval * factor), " (the job's ",
        absl::FormatDuration(interval), " x", factor,
        "), so a silent member is found LOST after ",
        absl::FormatDuration(interval * missed * factor),
        state.behind ? " or more while it catches up" : "");
  }
  if (state.behind) {
    return absl::StrCat(
        "the coordinator handles heartbeats late (past its capacity)",
        state.enabled ? "; it is about to ask for longer intervals"
                      : " and does not shed load (--shed_heartbeats=false): "
                        "live members may be found LOST");
  }
  return "";
}

std::shared_ptr<HealthManager::JobHealth> HealthManager::Monitored(
    const std::string& job_id, int64_t round) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = jobs_health_.find(job_id);
  if (it == jobs_health_.end() || it->second->round != round) return nullptr;
  return it->second;
}

void HealthManager::Summarize(v1::JobStatus* status) const {
  std::shared_ptr<JobHealth> job =
      Monitored(status->config().job_id(), status->round());
  if (job == nullptr) return;
  constexpr size_t kSlowest = 5;
  v1::JobSummary* summary = status->mutable_summary();
  std::vector<std::pair<absl::Duration, int>> slowest;  // min-heap by lag
  auto later = [](const auto& a, const auto& b) { return a > b; };
  absl::MutexLock lock(&job->mu);
  bool any = false;
  for (size_t r = 0; r < job->members.size(); ++r) {
    const MemberHealth& m = job->members[r];
    if (!m.heard) continue;
    summary->set_heard(summary->heard() + 1);
    const int64_t step = m.metrics.step();
    summary->set_min_step(any ? std::min(summary->min_step(), step) : step);
    summary->set_max_step(any ? std::max(summary->max_step(), step) : step);
    any = true;
    const absl::Duration lag = job->stragglers->lag(static_cast<int>(r));
    if (lag <= absl::ZeroDuration()) continue;
    if (slowest.size() < kSlowest || lag > slowest.front().first) {
      slowest.emplace_back(lag, static_cast<int>(r));
      std::push_heap(slowest.begin(), slowest.end(), later);
      if (slowest.size() > kSlowest) {
        std::pop_heap(slowest.begin(), slowest.end(), later);
        slowest.pop_back();
      }
    }
  }
  std::sort(slowest.begin(), slowest.end(), later);
  for (const auto& [lag, rank] : slowest) {
    v1::SlowRank* slow = summary->add_slowest();
    slow->set_rank(rank);
    *slow->mutable_lag() = ToProtoDuration(lag);
    slow->set_step(job->members[rank].metrics.step());
  }
  summary->set_stragglers(job->diagnosis.stragglers_size());
}

std::pair<int64_t, std::vector<int>> HealthManager::StragglerRanks(
    const std::string& job_id) const {
  std::shared_ptr<JobHealth> job;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = jobs_health_.find(job_id);
    if (it == jobs_health_.end()) return {0, {}};
    job = it->second;
  }
  absl::MutexLock lock(&job->mu);
  std::vector<int> ranks;
  for (const v1::Straggler& s : job->diagnosis.stragglers()) {
    ranks.push_back(s.rank());
  }
  return {job->round, std::move(ranks)};
}

void HealthManager::ForEachMember(
    const std::function<void(const MemberSample&)>& fn) const {
  const absl::Time now = clock_->Now();
  for (const std::shared_ptr<JobHealth>& job : Snapshot()) {
    absl::MutexLock lock(&job->mu);
    if (!job->current) continue;
    for (size_t r = 0; r < job->members.size(); ++r) {
      const MemberHealth& m = job->members[r];
      fn(MemberSample{&job->job_id, static_cast<int>(r), &m.host, m.state,
                      m.heard, now - m.last_seen,
                      job->stragglers->lag(static_cast<int>(r)), &m.metrics});
    }
  }
}

}  // namespace gradsync
