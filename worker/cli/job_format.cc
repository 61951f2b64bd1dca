#include "worker/cli/job_format.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
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
    list.push_back(std::move(j));
  }
  return list;
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
  if (!job.reason().empty()) summary.push_back({"reason", job.reason()});
  std::string out = RenderTable(summary);
  if (job.members_size() > 0) {
    absl::StrAppend(&out, "\nmembers (round ", job.round(), "):\n",
                    MembersTable(job.members(), now));
  }
  if (job.waiting_size() > 0) {
    absl::StrAppend(&out, "\nwaiting for the next round:\n",
                    MembersTable(job.waiting(), now));
  }
  if (job.spares_size() > 0) {
    absl::StrAppend(&out, "\nspares:\n", MembersTable(job.spares(), now));
  }
  return out;
}

std::string JobsToJson(const std::vector<v1::JobStatus>& jobs) {
  Json list = Json::array();
  for (const v1::JobStatus& job : jobs) list.push_back(SummaryJson(job));
  Json out;
  out["jobs"] = std::move(list);
  return out.dump(2) + "\n";
}

std::string JobStatusToJson(const v1::JobStatus& job) {
  Json out = SummaryJson(job);
  out["members"] = MembersJson(job.members());
  out["waiting"] = MembersJson(job.waiting());
  out["spares"] = MembersJson(job.spares());
  return out.dump(2) + "\n";
}

}  // namespace gradsync
