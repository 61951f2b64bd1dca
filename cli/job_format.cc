#include "cli/job_format.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"

namespace gradsync {
namespace {

using Json = nlohmann::ordered_json;

// Left-aligned columns separated by two spaces.
std::string RenderTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) {
        line.append(widths[i] - row[i].size() + 2, ' ');
      }
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

// "4s ago", "3m ago", "-" when unset.
std::string Ago(const google::protobuf::Timestamp& t, absl::Time now) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  absl::Duration age = std::max(absl::ZeroDuration(), now - FromProtoTime(t));
  if (age < absl::Minutes(1)) {
    return absl::StrCat(absl::ToInt64Seconds(age), "s ago");
  }
  if (age < absl::Hours(1)) {
    return absl::StrCat(absl::ToInt64Minutes(age), "m ago");
  }
  if (age < absl::Hours(48)) {
    return absl::StrCat(absl::ToInt64Hours(age), "h ago");
  }
  return absl::StrCat(absl::ToInt64Hours(age) / 24, "d ago");
}

std::string Rfc3339(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "";
  return absl::FormatTime(absl::RFC3339_sec, FromProtoTime(t),
                          absl::UTCTimeZone());
}

std::string Nodes(const v1::JobConfig& c) {
  return c.min_nodes() == c.max_nodes()
             ? absl::StrCat(c.min_nodes())
             : absl::StrCat(c.min_nodes(), ":", c.max_nodes());
}

std::string RankText(int rank) { return rank < 0 ? "-" : absl::StrCat(rank); }

// "850us", "12.5ms", "250ms", "1.25s", "-" for zero or less.
std::string Seconds(double seconds) {
  if (!(seconds > 0)) return "-";
  if (seconds < 1e-3) return absl::StrFormat("%.0fus", seconds * 1e6);
  if (seconds < 1e-2) return absl::StrFormat("%.1fms", seconds * 1e3);
  if (seconds < 1) return absl::StrFormat("%.0fms", seconds * 1e3);
  return absl::StrFormat("%.2fs", seconds);
}

std::string Throughput(double per_second) {
  return per_second > 0 ? absl::StrFormat("%.1f", per_second) : "-";
}

double ToSeconds(const google::protobuf::Duration& d) {
  return absl::ToDoubleSeconds(FromProtoDuration(d));
}

Json SummaryJson(const v1::JobStatus& job) {
  const v1::JobConfig& c = job.config();
  Json j;
  j["job"] = c.job_id();
  j["state"] = JobStateName(job.state());
  j["round"] = job.round();
  j["world_size"] = job.world_size();
  j["backend"] = BackendName(job.backend());
  j["min_nodes"] = c.min_nodes();
  j["max_nodes"] = c.max_nodes();
  j["nproc_per_node"] = c.nproc_per_node();
  j["backend_preference"] = BackendName(c.backend());
  j["reason"] = job.reason();
  j["created"] = Rfc3339(job.create_time());
  j["updated"] = Rfc3339(job.update_time());
  j["round_closed"] = Rfc3339(job.round_close_time());
  j["recovery_count"] = job.recovery_count();
  Json recoveries = Json::array();
  for (const v1::Recovery& r : job.recoveries()) {
    recoveries.push_back({{"failed_round", r.failed_round()},
                          {"new_round", r.new_round()},
                          {"cause", r.cause()},
                          {"old_world_size", r.old_world_size()},
                          {"new_world_size", r.new_world_size()},
                          {"resumed_in_place", r.resumed_in_place()},
                          {"resume_step", r.resume_step()},
                          {"source_rank", r.source_rank()},
                          {"detected", Rfc3339(r.detect_time())},
                          {"round_closed", Rfc3339(r.round_close_time())},
                          {"detection_seconds", ToSeconds(r.detection())},
                          {"rendezvous_seconds", ToSeconds(r.rendezvous())},
                          {"process_group_seconds",
                           ToSeconds(r.round_start().process_group())},
                          {"state_transfer_seconds",
                           ToSeconds(r.round_start().state_transfer())},
                          {"first_step_seconds",
                           ToSeconds(r.round_start().first_step())},
                          {"round_start_reports", r.round_start_reports()}});
  }
  j["recoveries"] = std::move(recoveries);
  return j;
}

Json MembersJson(
    const google::protobuf::RepeatedPtrField<v1::Member>& members) {
  Json list = Json::array();
  for (const v1::Member& m : members) {
    Json j;
    j["rank"] = m.rank();
    j["local_rank"] = m.local_rank();
    j["node_rank"] = m.node_rank();
    j["node"] = m.node().node_id();
    j["host"] = m.node().hostname();
    j["pid"] = m.node().pid();
    j["state"] = MemberStateName(m.state());
    j["device"] = DeviceTypeName(m.node().device_type());
    j["device_count"] = m.node().device_count();
    j["addresses"] = std::vector<std::string>(m.node().addresses().begin(),
                                              m.node().addresses().end());
    j["last_seen"] = Rfc3339(m.last_seen());
    j["state_reason"] = m.state_reason();
    if (m.has_metrics()) {
      const v1::WorkerMetrics& w = m.metrics();
      j["worker_state"] = WorkerStateName(w.state());
      j["step"] = w.step();
      j["samples_per_second"] = w.samples_per_second();
      j["step_seconds"] = w.step_timings().step_seconds();
      j["forward_seconds"] = w.step_timings().forward_seconds();
      j["backward_seconds"] = w.step_timings().backward_seconds();
      j["communication_seconds"] = w.step_timings().communication_seconds();
      j["hidden_communication_seconds"] =
          w.step_timings().hidden_communication_seconds();
      j["last_started_collective"] = w.last_started_collective();
      j["last_finished_collective"] = w.last_finished_collective();
      j["rss_bytes"] = w.rss_bytes();
      j["cpu_seconds"] = w.cpu_seconds();
      j["gpu_memory_bytes"] = w.gpu_memory_bytes();
      j["last_error"] = w.last_error();
      Json buckets = Json::array();
      for (const v1::BucketStats& b : w.buckets()) {
        buckets.push_back({{"index", b.index()},
                           {"bytes", b.bytes()},
                           {"allreduce_seconds", b.allreduce_seconds()},
                           {"algbw_bytes_per_second", b.algbw_bytes_per_second()}});
      }
      j["buckets"] = std::move(buckets);
    }
    j["lag_seconds"] = ToSeconds(m.lag());
    list.push_back(std::move(j));
  }
  return list;
}

// The per-rank view of a round's members: training progress and health.
std::string RanksTable(
    const google::protobuf::RepeatedPtrField<v1::Member>& members,
    absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "NODE", "HOST", "PID", "STATE", "STEP", "SAMPLES/S",
       "STEP TIME", "COMM TIME", "LAG", "LAST SEEN"}};
  for (const v1::Member& m : members) {
    const v1::WorkerMetrics& w = m.metrics();
    const bool heard = m.has_metrics();
    rows.push_back(
        {RankText(m.rank()), RankText(m.node_rank()), m.node().hostname(),
         absl::StrCat(m.node().pid()), MemberStateName(m.state()),
         heard ? absl::StrCat(w.step()) : "-",
         heard ? Throughput(w.samples_per_second()) : "-",
         heard ? Seconds(w.step_timings().step_seconds()) : "-",
         heard ? Seconds(w.step_timings().communication_seconds()) : "-",
         Seconds(ToSeconds(m.lag())), Ago(m.last_seen(), now)});
  }
  return RenderTable(rows);
}

// What failure detection found: hang, desync, stragglers, and why members
// were lost or exited. Empty when there is nothing to say.
std::string DiagnosisText(const v1::JobStatus& job) {
  std::vector<std::vector<std::string>> rows;
  const v1::JobDiagnosis& d = job.diagnosis();
  if (!d.desync().empty()) rows.push_back({"desync", d.desync()});
  if (d.has_divergence()) {
    rows.push_back({"divergence", absl::StrCat("round ", d.divergence().round(),
                                               ": ", d.divergence().verdict())});
  }
  if (d.replicas_verified_step() > 0) {
    rows.push_back({"replicas",
                    absl::StrCat("identical at step ", d.replicas_verified_step(),
                                 " (the latest compared)")});
  }
  if (!d.hang().empty()) rows.push_back({"hang", d.hang()});
  if (d.has_hang_timeout() && (d.hang_timeout_self_set() || !d.hang().empty())) {
    rows.push_back(
        {"hang timeout",
         absl::StrCat(Seconds(ToSeconds(d.hang_timeout())),
                      d.hang_timeout_self_set()
                          ? " (self-set from the step times)"
                          : " (the job's, or the default until the round "
                            "reports 8 steps)")});
  }
  if (d.has_rebalance()) {
    rows.push_back({"rebalanced", absl::StrCat("round ", d.rebalance().round(),
                                               ": ", d.rebalance().verdict())});
  }
  for (const v1::Straggler& s : d.stragglers()) {
    rows.push_back({"straggler",
                    absl::StrCat("rank ", s.rank(), " is ", Seconds(ToSeconds(s.lag())),
                                 " late to its first gradient bucket (median of ",
                                 s.steps(), " steps)")});
  }
  for (const v1::Member& m : job.members()) {
    if (!m.state_reason().empty()) {
      rows.push_back({absl::StrCat("rank ", m.rank()),
                      absl::StrCat(MemberStateName(m.state()), ": ",
                                   m.state_reason())});
    }
  }
  return rows.empty() ? "" : RenderTable(rows);
}

// The frame a one-line summary of a stack names: the innermost of
// gradsync's own, else the innermost that is not a wait primitive.
const std::string& TellingFrame(const v1::StackGroup& g) {
  for (const std::string& f : g.frames()) {
    if (absl::StartsWith(f, "gradsync::")) return f;
  }
  for (const std::string& f : g.frames()) {
    if (!absl::StartsWith(f, "absl::") && !absl::StartsWith(f, "Absl") &&
        !absl::StartsWith(f, "?? ") && !absl::StartsWith(f, "__") &&
        !absl::StartsWith(f, "pthread_") && f != "syscall") {
      return f;
    }
  }
  return g.frames(0);
}

// The stacks a hang verdict asked for: the threads of the hung ranks, and
// of the rank ahead, that the other side has not, in full (the contrast);
// the threads both sides have, a line each. Empty when no hang asked.
std::string HangStacksText(const v1::JobDiagnosis& d) {
  if (!d.has_hang_stacks()) return "";
  constexpr int kMaxFrames = 32;
  const v1::HangStacks& h = d.hang_stacks();
  const auto ranks = [](const auto& list) {
    return absl::StrJoin(list.begin(), list.end(), ",");
  };
  const auto threads = [&](const v1::StackGroup& g) {
    return absl::StrCat(g.ranks_size() == 1 ? "rank " : "ranks ",
                        ranks(g.ranks()), ", ", g.threads(),
                        g.threads() == 1 ? " thread (" : " threads (",
                        absl::StrJoin(g.thread_names(), ", "), ")");
  };
  std::string out = absl::StrCat(
      "\nstacks (asked ", h.hung_ranks_size() == 1 ? "rank " : "ranks ",
      ranks(h.hung_ranks()), " behind",
      h.healthy_rank() >= 0 ? absl::StrCat(" and rank ", h.healthy_rank(),
                                           " ahead for contrast")
                            : "",
      "; answered: ", h.answered_size() == 0 ? "none yet" : ranks(h.answered()),
      "):\n");
  std::vector<const v1::StackGroup*> shared;
  for (const v1::StackGroup& g : h.groups()) {
    const bool ahead_only = g.ranks_size() == 1 && g.ranks(0) == h.healthy_rank();
    if (!g.hung_only() && !ahead_only) {
      shared.push_back(&g);
      continue;
    }
    absl::StrAppend(&out, "  ", threads(g), g.hung_only() ? ", behind" : ", ahead",
                    " only:\n");
    const int shown = std::min(g.frames_size(), kMaxFrames);
    for (int i = 0; i < shown; ++i) {
      absl::StrAppend(&out, "      ", g.frames(i), "\n");
    }
    if (shown < g.frames_size()) {
      absl::StrAppend(&out, "      ... ", g.frames_size() - shown,
                      " more (--json shows all)\n");
    }
  }
  if (!shared.empty()) absl::StrAppend(&out, "  on both sides:\n");
  for (const v1::StackGroup* g : shared) {
    absl::StrAppend(&out, "    ", threads(*g), " in ", TellingFrame(*g), "\n");
  }
  for (const std::string& e : h.errors()) absl::StrAppend(&out, "  ", e, "\n");
  return out;
}

// The job's latest recoveries, newest first; empty when there were none.
std::string RecoveriesTable(const v1::JobStatus& job, absl::Time now) {
  if (job.recoveries_size() == 0) return "";
  // The members' phases are the slowest member's (of those that reported).
  std::vector<std::vector<std::string>> rows = {
      {"ROUNDS", "WORLD", "RESUMED", "DETECTION", "RENDEZVOUS", "PROCESS GROUP",
       "STATE COPY", "FIRST STEP", "WHEN", "CAUSE"}};
  for (int i = job.recoveries_size() - 1; i >= 0; --i) {
    const v1::Recovery& r = job.recoveries(i);
    const v1::RoundStartTimings& s = r.round_start();
    rows.push_back(
        {absl::StrCat(r.failed_round(), " -> ", r.new_round()),
         absl::StrCat(r.old_world_size(), " -> ", r.new_world_size()),
         r.resumed_in_place()
             ? absl::StrCat("after step ", r.resume_step(), " from rank ",
                            r.source_rank())
             : "no: processes restarted",
         Seconds(ToSeconds(r.detection())), Seconds(ToSeconds(r.rendezvous())),
         Seconds(ToSeconds(s.process_group())),
         Seconds(ToSeconds(s.state_transfer())),
         Seconds(ToSeconds(s.first_step())), Ago(r.detect_time(), now),
         r.cause()});
  }
  return absl::StrCat("\nrecoveries (", job.recovery_count(), " in all",
                      job.recovery_count() > job.recoveries_size()
                          ? absl::StrCat(", the latest ", job.recoveries_size())
                          : "",
                      "):\n", RenderTable(rows));
}

std::string MembersTable(
    const google::protobuf::RepeatedPtrField<v1::Member>& members,
    absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "LOCAL", "NODE", "NODE_ID", "HOST", "PID", "DEVICE", "STATE",
       "LAST SEEN"}};
  for (const v1::Member& m : members) {
    rows.push_back({RankText(m.rank()), RankText(m.local_rank()),
                    RankText(m.node_rank()), m.node().node_id(),
                    m.node().hostname(), absl::StrCat(m.node().pid()),
                    absl::StrCat(DeviceTypeName(m.node().device_type()), ":",
                                 m.node().device_count()),
                    MemberStateName(m.state()), Ago(m.last_seen(), now)});
  }
  return RenderTable(rows);
}

}  // namespace

std::string FormatJobsTable(const std::vector<v1::JobStatus>& jobs,
                            absl::Time now) {
  if (jobs.empty()) return "no jobs\n";
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "STATE", "ROUND", "WORLD", "NODES", "BACKEND", "CREATED"}};
  for (const v1::JobStatus& job : jobs) {
    rows.push_back({job.config().job_id(), JobStateName(job.state()),
                    absl::StrCat(job.round()), absl::StrCat(job.world_size()),
                    Nodes(job.config()), BackendName(job.backend()),
                    Ago(job.create_time(), now)});
  }
  return RenderTable(rows);
}

namespace {

// Rows saying what the members of the round are doing, from the status's
// summary: counts by state, progress, the slowest ranks.
void AddMemberSummary(const v1::JobStatus& job,
                      std::vector<std::vector<std::string>>* rows) {
  if (!job.has_summary() || job.world_size() == 0) return;
  const v1::JobSummary& s = job.summary();
  rows->push_back(
      {"members", absl::StrCat(s.active(), " active, ", s.lost(), " lost, ",
                               s.exited(), " exited; ", s.heard(), " of ",
                               job.world_size(), " heard from")});
  if (s.heard() > 0) {
    rows->push_back({"steps", s.min_step() == s.max_step()
                                  ? absl::StrCat(s.min_step())
                                  : absl::StrCat(s.min_step(), " to ",
                                                 s.max_step())});
  }
  if (s.slowest_size() > 0) {
    std::vector<std::string> slow;
    for (const v1::SlowRank& r : s.slowest()) {
      slow.push_back(absl::StrCat(
          "rank ", r.rank(), " +",
          absl::FormatDuration(absl::Trunc(FromProtoDuration(r.lag()),
                                           absl::Microseconds(100)))));
    }
    rows->push_back({"slowest", absl::StrCat(absl::StrJoin(slow, ", "), " (",
                                             s.stragglers(),
                                             " flagged as stragglers)")});
  }
}

}  // namespace

std::string FormatJobStatus(const v1::JobStatus& job, absl::Time now) {
  const v1::JobConfig& c = job.config();
  std::vector<std::vector<std::string>> summary = {
      {"job", c.job_id()},
      {"state", JobStateName(job.state())},
      {"round", job.round() == 0
                    ? std::string("none closed yet")
                    : absl::StrCat(job.round(), " (closed ",
                                   Ago(job.round_close_time(), now), ")")},
      {"world size", absl::StrCat(job.world_size(), " (nodes ", Nodes(c),
                                  " x ", c.nproc_per_node(),
                                  " process(es) per node)")},
      {"backend", absl::StrCat(BackendName(job.backend()), " (preference ",
                               BackendName(c.backend()), ")")},
      {"created", absl::StrCat(Rfc3339(job.create_time()), " (",
                               Ago(job.create_time(), now), ")")},
  };
  if (job.has_end_time()) {
    summary.push_back({"ended", absl::StrCat(Rfc3339(job.end_time()), " (",
                                             Ago(job.end_time(), now), ")")});
  }
  if (!job.reason().empty()) summary.push_back({"reason", job.reason()});
  AddMemberSummary(job, &summary);
  std::string out = RenderTable(summary);
  if (job.members_size() > 0) {
    const bool partial = job.has_summary() &&
                         job.members_size() < job.world_size();
    absl::StrAppend(
        &out, "\nmembers (round ", job.round(),
        partial ? absl::StrCat(", ", job.members_size(), " of the ",
                               job.summary().matching(), " selected")
                : std::string(),
        "):\n", RanksTable(job.members(), now));
  } else if (job.has_summary() && job.world_size() > 0) {
    // A large job lists only the members asked for (the CLI's default: the
    // unhealthy ones), and none matched.
    absl::StrAppend(&out, "\nmembers (round ", job.round(),
                    "): none of those selected (a large job lists only its "
                    "unhealthy members unless asked; --all lists every "
                    "member)\n");
  }
  const std::string diagnosis = DiagnosisText(job);
  if (!diagnosis.empty()) absl::StrAppend(&out, "\ndiagnosis:\n", diagnosis);
  absl::StrAppend(&out, HangStacksText(job.diagnosis()));
  absl::StrAppend(&out, RecoveriesTable(job, now));
  if (job.waiting_size() > 0) {
    absl::StrAppend(&out, "\nwaiting for the next round:\n",
                    MembersTable(job.waiting(), now));
  }
  if (job.spares_size() > 0) {
    absl::StrAppend(&out, "\nspares:\n", MembersTable(job.spares(), now));
  }
  return out;
}

std::string FormatCreatedJob(const v1::CreateJobResponse& created) {
  const std::string& id = created.job().config().job_id();
  if (created.token().empty()) {
    return absl::StrCat("job '", id,
                        "' created (the coordinator has no tokens)\n");
  }
  return absl::StrCat("job '", id, "' created; its workers' token:\n",
                      created.token(), "\n");
}

std::string CreatedJobToJson(const v1::CreateJobResponse& created) {
  Json out = SummaryJson(created.job());
  out["token"] = created.token();
  return out.dump(2) + "\n";
}

std::string JobsToJson(const std::vector<v1::JobStatus>& jobs) {
  Json list = Json::array();
  for (const v1::JobStatus& job : jobs) list.push_back(SummaryJson(job));
  Json out;
  out["jobs"] = std::move(list);
  return out.dump(2) + "\n";
}

namespace {

Json StatusJson(const v1::JobStatus& job) {
  Json out = SummaryJson(job);
  out["ended"] = Rfc3339(job.end_time());
  Json stragglers = Json::array();
  for (const v1::Straggler& s : job.diagnosis().stragglers()) {
    stragglers.push_back({{"rank", s.rank()},
                          {"lag_seconds", ToSeconds(s.lag())},
                          {"steps", s.steps()}});
  }
  const v1::Divergence& divergence = job.diagnosis().divergence();
  Json diverged = nullptr;
  if (job.diagnosis().has_divergence()) {
    diverged = {{"step", divergence.step()},
                {"round", divergence.round()},
                {"ranks", std::vector<int>(divergence.ranks().begin(),
                                           divergence.ranks().end())},
                {"tensors", std::vector<std::string>(divergence.tensors().begin(),
                                                     divergence.tensors().end())},
                {"verdict", divergence.verdict()}};
  }
  Json hang_stacks = nullptr;
  if (job.diagnosis().has_hang_stacks()) {
    const v1::HangStacks& h = job.diagnosis().hang_stacks();
    Json groups = Json::array();
    for (const v1::StackGroup& g : h.groups()) {
      groups.push_back(
          {{"ranks", std::vector<int>(g.ranks().begin(), g.ranks().end())},
           {"threads", g.threads()},
           {"thread_names", std::vector<std::string>(g.thread_names().begin(),
                                                     g.thread_names().end())},
           {"frames", std::vector<std::string>(g.frames().begin(),
                                               g.frames().end())},
           {"hung_only", g.hung_only()}});
    }
    hang_stacks = {
        {"hung_ranks", std::vector<int>(h.hung_ranks().begin(), h.hung_ranks().end())},
        {"healthy_rank", h.healthy_rank()},
        {"answered", std::vector<int>(h.answered().begin(), h.answered().end())},
        {"groups", std::move(groups)},
        {"errors", std::vector<std::string>(h.errors().begin(), h.errors().end())}};
  }
  Json rebalance = nullptr;
  if (job.diagnosis().has_rebalance()) {
    const v1::Rebalance& r = job.diagnosis().rebalance();
    rebalance = {{"round", r.round()},
                 {"shares", std::vector<int>(r.shares().begin(), r.shares().end())},
                 {"verdict", r.verdict()}};
  }
  out["diagnosis"] = {
      {"hang", job.diagnosis().hang()},
      {"rebalance", std::move(rebalance)},
      {"hang_stacks", std::move(hang_stacks)},
      {"desync", job.diagnosis().desync()},
      {"stragglers", std::move(stragglers)},
      {"divergence", std::move(diverged)},
      {"replicas_verified_step", job.diagnosis().replicas_verified_step()},
      {"hang_timeout_seconds", ToSeconds(job.diagnosis().hang_timeout())},
      {"hang_timeout_self_set", job.diagnosis().hang_timeout_self_set()}};
  out["members"] = MembersJson(job.members());
  out["waiting"] = MembersJson(job.waiting());
  out["spares"] = MembersJson(job.spares());
  return out;
}

}  // namespace

std::string JobStatusToJson(const v1::JobStatus& job) {
  return StatusJson(job).dump(2) + "\n";
}

std::string JobStatusToJsonLine(const v1::JobStatus& job) {
  return StatusJson(job).dump() + "\n";
}

}  // namespace gradsync
