#include "server/http/prometheus_metrics.h"

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <array>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "server/http/prometheus_text.h"

namespace gradsync {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

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


MetricFamily Family(const char* name, MetricType type, const char* help) {
  return MetricFamily{name, help, type, {}};
}

// Adds a sample to a counter or gauge family.
void Add(MetricFamily* family, Labels labels, double value) {
  ClientMetric& metric = family->metric.emplace_back();
  metric.label = std::move(labels);
  if (family->type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
}

// Jobs, members and rounds by state, and recoveries.
void AddCensus(const JobCensus& census, const RendezvousManager& rendezvous,
               std::vector<MetricFamily>* out) {
  MetricFamily jobs = Family("gradsync_jobs", MetricType::Gauge, "Jobs by state.");
  for (v1::JobState state : kJobStates) {
    auto it = census.jobs.find(state);
    Add(&jobs, {{"state", JobStateName(state)}},
        it == census.jobs.end() ? 0 : it->second);
  }
  out->push_back(std::move(jobs));
  const auto [waiting, spares] = rendezvous.CountPending();
  auto count = census.members;
  count[v1::MEMBER_STATE_WAITING] += waiting;
  count[v1::MEMBER_STATE_SPARE] += spares;
  MetricFamily members = Family(
      "gradsync_members", MetricType::Gauge,
      "Worker processes by state: members of the jobs' latest rounds, "
      "processes waiting for a round and spares.");
  for (v1::MemberState state :
       {v1::MEMBER_STATE_ACTIVE, v1::MEMBER_STATE_WAITING,
        v1::MEMBER_STATE_SPARE, v1::MEMBER_STATE_LOST,
        v1::MEMBER_STATE_EXITED}) {
    Add(&members, {{"state", MemberStateName(state)}}, count[state]);
  }
  out->push_back(std::move(members));
  MetricFamily rounds = Family("gradsync_rendezvous_rounds", MetricType::Gauge,
                               "Rendezvous rounds closed so far, by job.");
  for (const auto& [job_id, n] : census.rounds) {
    Add(&rounds, {{"job", job_id}}, n);
  }
  out->push_back(std::move(rounds));
  MetricFamily recoveries = Family(
      "gradsync_recoveries_total", MetricType::Counter,
      "In-place recoveries (a round re-formed after a failure), by job.");
  for (const auto& [job_id, n] : census.recoveries) {
    Add(&recoveries, {{"job", job_id}}, n);
  }
  out->push_back(std::move(recoveries));
}

// The recovery phases' histogram.
MetricFamily RecoveryPhases(const JobCensus& census) {
  MetricFamily family = Family(
      "gradsync_recovery_seconds", MetricType::Histogram,
      "Duration of recovery phases: detection (a silent member's time until "
      "it was found lost) and rendezvous (the failed round's end to the new "
      "round's close), once per recovery; process_group, state_transfer and "
      "first_step, once per member of a recovered round.");
  for (const auto& [phase, histogram] : census.recovery_phases) {
    ClientMetric& metric = family.metric.emplace_back();
    metric.label = {{"phase", phase}};
    metric.histogram.sample_count = histogram.count;
    metric.histogram.sample_sum = histogram.sum;
    uint64_t cumulative = 0;
    for (size_t b = 0; b < histogram.counts.size(); ++b) {
      cumulative += histogram.counts[b];
      metric.histogram.bucket.push_back(
          {cumulative, b < kRecoveryBuckets.size()
                           ? kRecoveryBuckets[b]
                           : std::numeric_limits<double>::infinity()});
    }
  }
  return family;
}

// Heartbeats, heartbeat load shedding (HeartbeatShedder) and what the
// heartbeats showed across jobs.
void AddHeartbeats(const HealthManager& health, std::vector<MetricFamily>* out) {
  const HeartbeatShedder::State shed = health.shedding();
  const struct {
    const char* name;
    MetricType type;
    const char* help;
    double value;
  } kHeartbeatMetrics[] = {
      {"gradsync_heartbeats_total", MetricType::Counter,
       "Worker heartbeats accepted.", static_cast<double>(health.heartbeats())},
      {"gradsync_replica_divergences_total", MetricType::Counter,
       "Replica divergences found: a step whose parameter and optimizer-state "
       "fingerprints differed across the ranks of a round (gradsync status "
       "names the job, ranks, step and tensors).",
       static_cast<double>(health.divergences())},
      {"gradsync_heartbeat_overloaded", MetricType::Gauge,
       "1 while the coordinator is past its heartbeat capacity and asks for "
       "longer heartbeat intervals, else 0.",
       shed.factor > 1 ? 1.0 : 0.0},
      {"gradsync_heartbeat_interval_factor", MetricType::Gauge,
       "The slowdown the whole heartbeat load needs now (1: none); each job "
       "is asked for its fair share of it, so a job sending less than its "
       "share keeps its own interval and the most a job is asked for is "
       "about this.",
       static_cast<double>(shed.factor)},
      {"gradsync_heartbeat_interval_seconds", MetricType::Gauge,
       "The heartbeat interval the interval factor makes of the coordinator's "
       "default interval.",
       absl::ToDoubleSeconds(health.default_interval() * shed.factor)},
      {"gradsync_heartbeat_shed_periods_total", MetricType::Counter,
       "Times the coordinator started shedding heartbeat load.",
       static_cast<double>(shed.shed_periods)},
      {"gradsync_heartbeat_behind", MetricType::Gauge,
       "1 while the coordinator runs behind its heartbeats (a queue delay, or "
       "many heartbeats late): meanwhile every LOST deadline is extended by "
       "gradsync_heartbeat_allowance_seconds, else 0.",
       shed.behind ? 1.0 : 0.0},
      {"gradsync_heartbeat_allowance_seconds", MetricType::Gauge,
       "How much longer than its missed-heartbeat window a member may be "
       "silent now, while the coordinator is behind (the time behind, capped "
       "per job at its window x the largest slowdown); 0 when not behind.",
       absl::ToDoubleSeconds(health.allowance())},
      {"gradsync_heartbeat_late_ratio", MetricType::Gauge,
       "Fraction of the heartbeats handled in the last window that came late "
       "after their member's previous one (by over 1.5 of the intervals it "
       "was asked for): the overload signal.",
       shed.late_fraction},
  };
  for (const auto& m : kHeartbeatMetrics) {
    MetricFamily family = Family(m.name, m.type, m.help);
    Add(&family, {}, m.value);
    out->push_back(std::move(family));
  }
}

}  // namespace

std::string RenderMetrics(const JobManager& jobs,
                          const RendezvousManager& rendezvous,
                          const HealthManager& health, const RpcStats& rpcs) {
  const prometheus::TextSerializer serializer;
  std::vector<MetricFamily> families;
  const JobCensus census = jobs.Census();
  AddCensus(census, rendezvous, &families);
  families.push_back(RecoveryPhases(census));
  AddHeartbeats(health, &families);
  std::string text = serializer.Serialize(families);
  // Per-rank gauges of the monitored rounds, one family after the other, in
  // one pass over the members (see prometheus_text.h for why not through
  // prometheus-cpp).
  std::array<PrometheusText, std::size(kMemberGauges)> ranks;
  for (size_t i = 0; i < ranks.size(); ++i) {
    ranks[i].Family(kMemberGauges[i].name, "gauge", kMemberGauges[i].help);
  }
  health.ForEachMember([&](const MemberSample& s) {
    const std::string rank = absl::StrCat(s.rank);
    const PrometheusLabels labels = {
        {"job", *s.job_id}, {"rank", rank}, {"host", *s.host}};
    for (size_t i = 0; i < ranks.size(); ++i) {
      ranks[i].Sample(kMemberGauges[i].name, labels, kMemberGauges[i].value(s));
    }
  });
  for (PrometheusText& family : ranks) text += family.Take();
  text += serializer.Serialize(rpcs.Collect());
  return text;
}

}  // namespace gradsync
