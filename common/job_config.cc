#include "common/job_config.h"

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

bool IsLowerAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

absl::Status ValidateTimeout(const char* field,
                             const google::protobuf::Duration& d) {
  absl::Status valid = CheckProtoDuration(field, d);
  if (!valid.ok()) return valid;
  absl::Duration value = FromProtoDuration(d);
  if (value < absl::ZeroDuration() || value > kMaxTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be between 0 and ",
                     absl::FormatDuration(kMaxTimeout), ", got ",
                     absl::FormatDuration(value)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobId(absl::string_view job_id) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError("job id is empty");
  }
  bool ok = job_id.size() <= 63 && IsLowerAlnum(job_id.front()) &&
            IsLowerAlnum(job_id.back());
  for (char c : job_id) ok = ok && (IsLowerAlnum(c) || c == '-');
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id '", job_id.substr(0, 80),
        "' is not a DNS label: use 1-63 characters of a-z, 0-9 and '-', "
        "starting and ending with a letter or digit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<int, int>> ParseNodeRange(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  int min_nodes = 0;
  int max_nodes = 0;
  bool ok = parts.size() <= 2 && absl::SimpleAtoi(parts[0], &min_nodes);
  if (ok) {
    max_nodes = min_nodes;
    if (parts.size() == 2) ok = absl::SimpleAtoi(parts[1], &max_nodes);
  }
  if (!ok || min_nodes < 1 || max_nodes < min_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node range '", text,
        "' is not N or MIN:MAX with 1 <= MIN <= MAX (e.g. 2 or 2:4)"));
  }
  return std::make_pair(min_nodes, max_nodes);
}

namespace {

// The parts of NormalizeJobConfig: each fills in defaults of its fields of
// `out` and checks them, with errors naming the job.

absl::Status NormalizeShape(v1::JobConfig* out) {
  if (out->min_nodes() == 0) out->set_min_nodes(kDefaultMinNodes);
  if (out->max_nodes() == 0) out->set_max_nodes(out->min_nodes());
  if (out->min_nodes() < 1 || out->max_nodes() > kMaxNodes ||
      out->max_nodes() < out->min_nodes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", out->job_id(), "': nodes ", out->min_nodes(), ":",
        out->max_nodes(), " is not a range with 1 <= MIN <= MAX <= ",
        kMaxNodes));
  }
  if (out->nproc_per_node() == 0) {
    out->set_nproc_per_node(kDefaultNprocPerNode);
  }
  if (out->nproc_per_node() < 1 || out->nproc_per_node() > kMaxNprocPerNode) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", out->job_id(), "': nproc_per_node must be in [1, ",
        kMaxNprocPerNode, "], got ", out->nproc_per_node()));
  }
  return absl::OkStatus();
}

absl::Status NormalizeRendezvousTimeouts(v1::JobConfig* out) {
  absl::Status status = ValidateTimeout("join_timeout", out->join_timeout());
  if (status.ok()) {
    status = ValidateTimeout("last_call_timeout", out->last_call_timeout());
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", out->job_id(), "': ", status.message()));
  }
  if (FromProtoDuration(out->join_timeout()) == absl::ZeroDuration()) {
    *out->mutable_join_timeout() = ToProtoDuration(kDefaultJoinTimeout);
  }
  if (!out->has_last_call_timeout()) {
    *out->mutable_last_call_timeout() =
        ToProtoDuration(kDefaultLastCallTimeout);
  }
  return absl::OkStatus();
}

// Health settings: zero means the coordinator's default, which only the
// coordinator knows, so they stay zero here.
absl::Status CheckHealthSettings(const v1::JobConfig& out) {
  for (const auto& [field, value] :
       {std::make_pair("heartbeat_interval", &out.heartbeat_interval()),
        std::make_pair("straggler_threshold", &out.straggler_threshold()),
        std::make_pair("hang_timeout", &out.hang_timeout())}) {
    absl::Status status = ValidateTimeout(field, *value);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("job '", out.job_id(), "': ", status.message()));
    }
  }
  if (out.missed_heartbeats() < 0 ||
      out.missed_heartbeats() > kMaxMissedHeartbeats) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", out.job_id(), "': missed_heartbeats must be in [0, ",
        kMaxMissedHeartbeats, "], got ", out.missed_heartbeats()));
  }
  return absl::OkStatus();
}

// The enums: known values only; an unspecified backend is AUTO (an
// unspecified failure policy means DEGRADE where it is read).
absl::Status NormalizeChoices(v1::JobConfig* out) {
  auto unknown = [out](const char* what, int value) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", out->job_id(), "': unknown ", what, " ", value));
  };
  if (!v1::Backend_IsValid(out->backend())) {
    return unknown("backend", out->backend());
  }
  if (out->backend() == v1::BACKEND_UNSPECIFIED) {
    out->set_backend(v1::BACKEND_AUTO);
  }
  if (!v1::FailurePolicy_IsValid(out->failure_policy())) {
    return unknown("failure_policy", out->failure_policy());
  }
  if (!v1::DivergencePolicy_IsValid(out->divergence_policy())) {
    return unknown("divergence_policy", out->divergence_policy());
  }
  if (!v1::StragglerPolicy_IsValid(out->straggler_policy())) {
    return unknown("straggler_policy", out->straggler_policy());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobConfig> NormalizeJobConfig(const v1::JobConfig& config) {
  v1::JobConfig out = config;
  GS_RETURN_IF_ERROR(ValidateJobId(out.job_id()));
  GS_RETURN_IF_ERROR(NormalizeShape(&out));
  GS_RETURN_IF_ERROR(NormalizeRendezvousTimeouts(&out));
  GS_RETURN_IF_ERROR(NormalizeChoices(&out));
  GS_RETURN_IF_ERROR(CheckHealthSettings(out));
  return out;
}

bool SameJobConfig(const v1::JobConfig& a, const v1::JobConfig& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

absl::Duration FromProtoDuration(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

google::protobuf::Duration ToProtoDuration(absl::Duration d) {
  google::protobuf::Duration out;
  int64_t seconds = absl::IDivDuration(d, absl::Seconds(1), &d);
  out.set_seconds(seconds);
  out.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d)));
  return out;
}

absl::Status CheckProtoDuration(absl::string_view field,
                                const google::protobuf::Duration& d) {
  constexpr int64_t kMaxSeconds = int64_t{315576000000};  // 10,000 years
  if (d.seconds() < -kMaxSeconds || d.seconds() > kMaxSeconds ||
      d.nanos() < -999999999 || d.nanos() > 999999999 ||
      (d.seconds() > 0 && d.nanos() < 0) || (d.seconds() < 0 && d.nanos() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is not a valid google.protobuf.Duration (seconds ",
        d.seconds(), ", nanos ", d.nanos(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckProtoTime(absl::string_view field,
                            const google::protobuf::Timestamp& t) {
  // 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
  if (t.seconds() < int64_t{-62135596800} ||
      t.seconds() > int64_t{253402300799} || t.nanos() < 0 ||
      t.nanos() > 999999999) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is not a valid google.protobuf.Timestamp (seconds ",
        t.seconds(), ", nanos ", t.nanos(), ")"));
  }
  return absl::OkStatus();
}

absl::Time FromProtoTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

google::protobuf::Timestamp ToProtoTime(absl::Time t) {
  google::protobuf::Timestamp out;
  int64_t seconds = absl::ToUnixSeconds(t);
  out.set_seconds(seconds);
  out.set_nanos(static_cast<int32_t>(
      absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(seconds))));
  return out;
}

std::string BackendName(v1::Backend backend) {
  switch (backend) {
    case v1::BACKEND_AUTO:
      return "auto";
    case v1::BACKEND_GLOO:
      return "gloo";
    case v1::BACKEND_NCCL:
      return "nccl";
    default:
      return "-";
  }
}

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_WAITING:
      return "waiting";
    case v1::JOB_STATE_RUNNING:
      return "running";
    case v1::JOB_STATE_DEGRADED:
      return "degraded";
    case v1::JOB_STATE_SUCCEEDED:
      return "succeeded";
    case v1::JOB_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

std::string MemberStateName(v1::MemberState state) {
  switch (state) {
    case v1::MEMBER_STATE_ACTIVE:
      return "active";
    case v1::MEMBER_STATE_WAITING:
      return "waiting";
    case v1::MEMBER_STATE_SPARE:
      return "spare";
    case v1::MEMBER_STATE_LOST:
      return "lost";
    case v1::MEMBER_STATE_EXITED:
      return "exited";
    default:
      return "unknown";
  }
}

std::string WorkerStateName(v1::WorkerState state) {
  switch (state) {
    case v1::WORKER_STATE_STARTING:
      return "starting";
    case v1::WORKER_STATE_TRAINING:
      return "training";
    case v1::WORKER_STATE_EVALUATING:
      return "evaluating";
    case v1::WORKER_STATE_CHECKPOINTING:
      return "checkpointing";
    case v1::WORKER_STATE_STOPPING:
      return "stopping";
    default:
      return "-";
  }
}

std::string DeviceTypeName(v1::DeviceType type) {
  switch (type) {
    case v1::DEVICE_TYPE_CPU:
      return "cpu";
    case v1::DEVICE_TYPE_CUDA:
      return "cuda";
    case v1::DEVICE_TYPE_SIM:
      return "sim";
    default:
      return "-";
  }
}

absl::StatusOr<v1::DeviceType> ParseDeviceType(absl::string_view name) {
  if (name == "cpu") return v1::DEVICE_TYPE_CPU;
  if (name == "cuda") return v1::DEVICE_TYPE_CUDA;
  if (name == "sim") return v1::DEVICE_TYPE_SIM;
  return absl::InvalidArgumentError(absl::StrCat(
      "the device must be cpu, cuda or sim (a simulated GPU), got '", name,
      "'"));
}

absl::Status CheckDeviceType(v1::DeviceType type) {
  if (type == v1::DEVICE_TYPE_CPU || type == v1::DEVICE_TYPE_CUDA ||
      type == v1::DEVICE_TYPE_SIM) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the device must be cpu, cuda or sim (a simulated GPU), got DeviceType ",
      static_cast<int>(type)));
}

absl::StatusOr<v1::Backend> ParseBackend(absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower == "auto") return v1::BACKEND_AUTO;
  if (lower == "gloo") return v1::BACKEND_GLOO;
  if (lower == "nccl") return v1::BACKEND_NCCL;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "': use auto, gloo or nccl"));
}

bool MayRunNccl(v1::DeviceType device, v1::Backend backend) {
  const bool gpu =
      device == v1::DEVICE_TYPE_CUDA || device == v1::DEVICE_TYPE_SIM;
  return gpu && (backend == v1::BACKEND_AUTO || backend == v1::BACKEND_NCCL);
}

absl::StatusOr<v1::FailurePolicy> ParseFailurePolicy(absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower.empty()) return v1::FAILURE_POLICY_UNSPECIFIED;
  if (lower == "recover") return v1::FAILURE_POLICY_RECOVER;
  if (lower == "fail") return v1::FAILURE_POLICY_FAIL;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown failure policy '", name, "': use recover or fail"));
}

absl::StatusOr<v1::DivergencePolicy> ParseDivergencePolicy(
    absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower.empty()) return v1::DIVERGENCE_POLICY_UNSPECIFIED;
  if (lower == "heal") return v1::DIVERGENCE_POLICY_HEAL;
  if (lower == "fail") return v1::DIVERGENCE_POLICY_FAIL;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown divergence policy '", name, "': use heal or fail"));
}

absl::StatusOr<v1::StragglerPolicy> ParseStragglerPolicy(
    absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower.empty()) return v1::STRAGGLER_POLICY_UNSPECIFIED;
  if (lower == "rebalance") return v1::STRAGGLER_POLICY_REBALANCE;
  if (lower == "report") return v1::STRAGGLER_POLICY_REPORT;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown straggler policy '", name, "': use rebalance or report"));
}

}  // namespace gradsync
