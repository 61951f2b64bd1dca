#include "server/metrics.h"

#include <array>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "server/prometheus_text.h"

namespace gradsync {
namespace {

constexpr std::array<v1::JobState, 5> kJobStates = {
    v1::JOB_STATE_WAITING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_DEGRADED,
    v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED};

// One per-rank gauge: its name, help and how to read it from a sample.
struct MemberGauge {
  const char* name;
  const char* help;
  double (*value)(const MemberSample&);
};

const MemberGauge kMemberGauges[] = {
    {"gradsync_member_up", "1 while the member is active, 0 once lost or exited.",
     [](const MemberSample& s) {
       return s.state == v1::MEMBER_STATE_ACTIVE ? 1.0 : 0.0;
     }},
    {"gradsync_member_heartbeat_age_seconds",
     "Time since the member's last heartbeat (or since monitoring began).",
     [](const MemberSample& s) { return absl::ToDoubleSeconds(s.age); }},
    {"gradsync_member_step", "Optimizer steps the member completed.",
     [](const MemberSample& s) { return static_cast<double>(s.metrics->step()); }},
    {"gradsync_member_samples_per_second", "Training throughput of the member.",
     [](const MemberSample& s) { return s.metrics->samples_per_second(); }},
    {"gradsync_member_step_seconds", "Wall time of the member's latest step.",
     [](const MemberSample& s) {
       return s.metrics->step_timings().step_seconds();
     }},
    {"gradsync_member_communication_seconds",
     "Communication the member's latest step waited for.",
     [](const MemberSample& s) {
       return s.metrics->step_timings().communication_seconds();
     }},
    {"gradsync_member_lag_seconds",
     "Median lag of the member's first gradient bucket behind the earliest "
     "rank.",
     [](const MemberSample& s) { return absl::ToDoubleSeconds(s.lag); }},
    {"gradsync_member_rss_bytes", "Resident memory of the member's process.",
     [](const MemberSample& s) {
       return static_cast<double>(s.metrics->rss_bytes());
     }},
    {"gradsync_member_gpu_memory_bytes", "CUDA memory of the member's process.",
     [](const MemberSample& s) {
       return static_cast<double>(s.metrics->gpu_memory_bytes());
     }},
};

}  // namespace

std::string RenderMetrics(const JobManager& jobs,
                          const RendezvousManager& rendezvous,
                          const HealthManager& health, const RpcStats& rpcs) {
  PrometheusText out;
  const JobCensus census = jobs.Census();
  out.Family("gradsync_jobs", "gauge", "Jobs by state.");
  for (v1::JobState state : kJobStates) {
    auto it = census.jobs.find(state);
    out.Sample("gradsync_jobs", {{"state", JobStateName(state)}},
               int64_t{it == census.jobs.end() ? 0 : it->second});
  }
  const auto [waiting, spares] = rendezvous.CountPending();
  auto members = census.members;
  members[v1::MEMBER_STATE_WAITING] += waiting;
  members[v1::MEMBER_STATE_SPARE] += spares;
  out.Family("gradsync_members", "gauge",
             "Worker processes by state: members of the jobs' latest rounds, "
             "processes waiting for a round and spares.");
  for (v1::MemberState state :
       {v1::MEMBER_STATE_ACTIVE, v1::MEMBER_STATE_WAITING,
        v1::MEMBER_STATE_SPARE, v1::MEMBER_STATE_LOST,
        v1::MEMBER_STATE_EXITED}) {
    out.Sample("gradsync_members", {{"state", MemberStateName(state)}},
               int64_t{members[state]});
  }
  out.Family("gradsync_rendezvous_rounds", "gauge",
             "Rendezvous rounds closed so far, by job.");
  for (const auto& [job_id, rounds] : census.rounds) {
    out.Sample("gradsync_rendezvous_rounds", {{"job", job_id}}, rounds);
  }
  out.Family("gradsync_recoveries_total", "counter",
             "In-place recoveries (a round re-formed after a failure), by "
             "job.");
  for (const auto& [job_id, count] : census.recoveries) {
    out.Sample("gradsync_recoveries_total", {{"job", job_id}}, count);
  }
  out.Family("gradsync_recovery_seconds", "histogram",
             "Duration of recovery phases: detection (a silent member's time "
             "until it was found lost) and rendezvous (the failed round's end "
             "to the new round's close), once per recovery; process_group, "
             "state_transfer and first_step, once per member of a recovered "
             "round.");
  for (const auto& [phase, histogram] : census.recovery_phases) {
    int64_t cumulative = 0;
    for (size_t b = 0; b < histogram.counts.size(); ++b) {
      cumulative += histogram.counts[b];
      const std::string le = b < kRecoveryBuckets.size()
                                 ? absl::StrCat(kRecoveryBuckets[b])
                                 : "+Inf";
      out.Sample("gradsync_recovery_seconds_bucket",
                 {{"phase", phase}, {"le", le}}, cumulative);
    }
    out.Sample("gradsync_recovery_seconds_sum", {{"phase", phase}},
               histogram.sum);
    out.Sample("gradsync_recovery_seconds_count", {{"phase", phase}},
               histogram.count);
  }
  out.Family("gradsync_heartbeats_total", "counter",
             "Worker heartbeats accepted.");
  out.Sample("gradsync_heartbeats_total", {}, health.heartbeats());
  // Heartbeat load shedding (HeartbeatShedder).
  const HeartbeatShedder::State shed = health.shedding();
  out.Family("gradsync_heartbeat_overloaded", "gauge",
             "1 while the coordinator is past its heartbeat capacity and "
             "asks for longer heartbeat intervals, else 0.");
  out.Sample("gradsync_heartbeat_overloaded", {},
             int64_t{shed.factor > 1 ? 1 : 0});
  out.Family("gradsync_heartbeat_interval_factor", "gauge",
             "How many times their job's interval the coordinator asks "
             "workers to heartbeat at now (1: the job's own).");
  out.Sample("gradsync_heartbeat_interval_factor", {}, int64_t{shed.factor});
  out.Family("gradsync_heartbeat_interval_seconds", "gauge",
             "The heartbeat interval the coordinator asks for now of jobs "
             "with its default interval.");
  out.Sample("gradsync_heartbeat_interval_seconds", {},
             absl::ToDoubleSeconds(health.default_interval() * shed.factor));
  out.Family("gradsync_heartbeat_shed_periods_total", "counter",
             "Times the coordinator started shedding heartbeat load.");
  out.Sample("gradsync_heartbeat_shed_periods_total", {}, shed.shed_periods);
  out.Family("gradsync_heartbeat_late_ratio", "gauge",
             "Fraction of the heartbeats handled in the last window that "
             "came late after their member's previous one (by over 1.5 of "
             "the intervals it was asked for): the overload signal.");
  out.Sample("gradsync_heartbeat_late_ratio", {}, shed.late_fraction);

  // Per-rank gauges of the monitored rounds, one family after the other.
  std::array<PrometheusText, std::size(kMemberGauges)> families;
  for (size_t i = 0; i < families.size(); ++i) {
    families[i].Family(kMemberGauges[i].name, "gauge", kMemberGauges[i].help);
  }
  health.ForEachMember([&](const MemberSample& s) {
    const std::string rank = absl::StrCat(s.rank);
    const PrometheusLabels labels = {
        {"job", *s.job_id}, {"rank", rank}, {"host", *s.host}};
    for (size_t i = 0; i < families.size(); ++i) {
      families[i].Sample(kMemberGauges[i].name, labels,
                         kMemberGauges[i].value(s));
    }
  });
  std::string text = out.Take();
  for (PrometheusText& family : families) text += family.Take();
  rpcs.Render(&out);
  text += out.Take();
  return text;
}

}  // namespace gradsync
