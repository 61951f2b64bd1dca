#include "worker/runtime/join.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/status_macros.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {

absl::StatusOr<v1::JoinRequest> BuildJoinRequest(const JoinConfig& config) {
  GS_RETURN_IF_ERROR(ValidateJobId(config.job_id));
  if (config.address.empty()) {
    return absl::InvalidArgumentError(
        "a worker needs an address the other workers can reach it at");
  }
  v1::JoinRequest request;
  request.set_job_id(config.job_id);
  v1::JobConfig* job = request.mutable_config();
  job->set_job_id(config.job_id);
  GS_ASSIGN_OR_RETURN(auto range, ParseNodeRange(config.nnodes));
  job->set_min_nodes(range.first);
  job->set_max_nodes(range.second);
  job->set_nproc_per_node(config.nproc_per_node);
  *job->mutable_join_timeout() = ToProtoDuration(config.join_timeout);
  *job->mutable_last_call_timeout() =
      ToProtoDuration(config.last_call_timeout);
  GS_ASSIGN_OR_RETURN(v1::Backend backend, ParseBackend(config.backend));
  job->set_backend(backend);
  GS_ASSIGN_OR_RETURN(v1::FailurePolicy policy,
                      ParseFailurePolicy(config.failure_policy));
  job->set_failure_policy(policy);
  GS_ASSIGN_OR_RETURN(v1::DivergencePolicy divergence,
                      ParseDivergencePolicy(config.divergence_policy));
  job->set_divergence_policy(divergence);
  GS_ASSIGN_OR_RETURN(v1::StragglerPolicy straggler,
                      ParseStragglerPolicy(config.straggler_policy));
  job->set_straggler_policy(straggler);
  if (config.straggler_threshold < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the straggler threshold must not be negative, got ",
        absl::FormatDuration(config.straggler_threshold)));
  }
  if (config.straggler_threshold > absl::ZeroDuration()) {
    *job->mutable_straggler_threshold() =
        ToProtoDuration(config.straggler_threshold);
  }

  v1::NodeDescriptor node = LocalNodeDescriptor();
  if (!config.node_id.empty()) node.set_node_id(config.node_id);
  node.set_device_type(config.device_type);
  node.set_device_count(config.device_count);
  node.set_nccl_available(config.nccl_available);
  node.add_addresses(config.address);
  *request.mutable_node() = std::move(node);
  return request;
}

std::string DefaultWorkerAddress(const std::string& coordinator_target) {
  // Of several coordinator replicas ("A,B"), the first stands for all.
  std::string host = coordinator_target.substr(0, coordinator_target.find(','));
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') - 1);
  } else if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  if (host == "localhost" || absl::StartsWith(host, "127.") || host == "::1") {
    return "127.0.0.1";
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}

}  // namespace gradsync
