#include "server/join_request.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

constexpr size_t kMaxIdBytes = 253;
constexpr size_t kMaxRejoinReasonBytes = 1024;
constexpr int kMaxAddresses = 64;
constexpr int kMaxDeviceCount = 1024;

}  // namespace

const std::string& NodeIdOf(const v1::NodeDescriptor& node) {
  return node.node_id().empty() ? node.hostname() : node.node_id();
}

std::string DescribeProcess(const v1::NodeDescriptor& node) {
  return absl::StrCat("node '", node.node_id(), "' (host ", node.hostname(),
                      ", pid ", node.pid(), ")");
}

bool HasJobSettings(const v1::JoinRequest& request) {
  if (!request.has_config()) return false;
  v1::JobConfig settings = request.config();
  settings.clear_job_id();
  return settings.ByteSizeLong() > 0;
}

bool CanUseNccl(const v1::NodeDescriptor& node) {
  return node.nccl_available() &&
         (node.device_type() == v1::DEVICE_TYPE_CUDA ||
          node.device_type() == v1::DEVICE_TYPE_SIM) &&
         node.device_count() > 0;
}

absl::Status NcclRefusal(const v1::JoinRequest& request) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job '", request.job_id(), "' requires the nccl backend but ",
      DescribeProcess(request.node()),
      " reports no CUDA device with NCCL: start it on a GPU node or let "
      "the job use backend auto or gloo"));
}

absl::Status ValidateNodeDescriptor(const v1::NodeDescriptor& node) {
  if (node.incarnation_id().empty() ||
      node.incarnation_id().size() > kMaxIncarnationBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node.incarnation_id must be 1-", kMaxIncarnationBytes,
        " bytes (a random id per process start), got ",
        node.incarnation_id().size()));
  }
  if (node.node_id().empty() && node.hostname().empty()) {
    return absl::InvalidArgumentError(
        "node needs a node_id or a hostname to group its processes by");
  }
  if (node.node_id().size() > kMaxIdBytes ||
      node.hostname().size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node.node_id and node.hostname are at most ", kMaxIdBytes, " bytes"));
  }
  if (node.addresses_size() > kMaxAddresses) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node lists ", node.addresses_size(), " addresses; at most ",
        kMaxAddresses));
  }
  for (const std::string& address : node.addresses()) {
    if (address.empty() || address.size() > kMaxIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node.addresses entries must be 1-", kMaxIdBytes, " bytes"));
    }
  }
  if (node.pid() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.pid must be >= 0, got ", node.pid()));
  }
  if (!v1::DeviceType_IsValid(node.device_type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown node.device_type ", node.device_type()));
  }
  if (node.device_count() < 0 || node.device_count() > kMaxDeviceCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.device_count must be in [0, ", kMaxDeviceCount,
                     "], got ", node.device_count()));
  }
  return absl::OkStatus();
}

absl::Status CheckProcessJoin(const v1::JoinRequest& request) {
  GS_RETURN_IF_ERROR(ValidateNodeDescriptor(request.node()));
  if (request.has_local_slot() && request.local_slot() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_slot must be >= 0, got ", request.local_slot()));
  }
  if (request.committed_step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "committed_step must be >= 0, got ", request.committed_step()));
  }
  if (request.rejoin_reason().size() > kMaxRejoinReasonBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rejoin_reason is at most ", kMaxRejoinReasonBytes, " bytes"));
  }
  // Refuse a node that cannot run NCCL a job forced to NCCL by this very
  // request before GetOrCreate can create the job: a refused join must not
  // leave a job behind, or its retry with another backend would meet a config
  // mismatch. (Invalid settings are left to GetOrCreate to report.)
  if (HasJobSettings(request) && !CanUseNccl(request.node())) {
    v1::JobConfig settings = request.config();
    if (settings.job_id().empty()) settings.set_job_id(request.job_id());
    absl::StatusOr<v1::JobConfig> normalized = NormalizeJobConfig(settings);
    if (settings.job_id() == request.job_id() && normalized.ok() &&
        normalized->backend() == v1::BACKEND_NCCL) {
      return NcclRefusal(request);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNodeSize(const std::vector<v1::JoinRequest>& processes,
                           const v1::JobConfig& config) {
  if (static_cast<int>(processes.size()) <= config.nproc_per_node()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "a node join lists ", processes.size(), " processes; job '",
      config.job_id(), "' runs ", config.nproc_per_node(),
      " per node (nproc_per_node)"));
}

absl::StatusOr<std::vector<v1::JoinRequest>> SplitNodeJoin(
    const v1::JoinNodeRequest& request) {
  if (request.processes().empty()) {
    return absl::InvalidArgumentError("a node join lists no processes");
  }
  std::vector<v1::JoinRequest> processes;
  absl::flat_hash_set<std::string> incarnations;
  for (const v1::ProcessJoin& process : request.processes()) {
    v1::JoinRequest& join = processes.emplace_back();
    join.set_job_id(request.job_id());
    if (request.has_config()) *join.mutable_config() = request.config();
    *join.mutable_node() = process.node();
    join.set_last_round(process.last_round());
    join.set_has_state(process.has_state());
    join.set_committed_step(process.committed_step());
    if (process.has_local_slot()) join.set_local_slot(process.local_slot());
    join.set_rejoin_reason(request.rejoin_reason());
    if (!incarnations.insert(process.node().incarnation_id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a node join lists incarnation '", process.node().incarnation_id(),
          "' twice: every process needs its own"));
    }
    if (NodeIdOf(process.node()) != NodeIdOf(request.processes(0).node())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a node join mixes nodes '", NodeIdOf(request.processes(0).node()),
          "' and '", NodeIdOf(process.node()),
          "': it carries the processes of one node"));
    }
  }
  return processes;
}

}  // namespace gradsync
