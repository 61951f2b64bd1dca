// gradsync-sim-worker: a stand-in worker that joins a job and bootstraps
// through the coordinator's key-value store exactly as a real backend does
// (every rank publishes its address, rank 0 publishes a communicator id, all
// ranks meet at a barrier), then prints its assignment and exits 0.
//
//   gradsync-sim-worker --coordinator=HOST:PORT --job=NAME --nnodes=MIN[:MAX]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/client/coordinator_client.h"
#include "worker/runtime/join.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:29400",
          "the coordinator, HOST:PORT");
ABSL_FLAG(std::string, job, "", "job id (created by the first join)");
ABSL_FLAG(std::string, nnodes, "1", "nodes per round: N or MIN:MAX");
ABSL_FLAG(int, nproc_per_node, 1, "worker processes per node");
ABSL_FLAG(std::string, node_id, "",
          "groups this process with others on the same node (default: "
          "hostname)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda (cuda claims NCCL)");
ABSL_FLAG(std::string, backend, "auto", "auto, gloo or nccl");
ABSL_FLAG(absl::Duration, join_timeout, absl::Minutes(10),
          "how long to wait for the round to close");
ABSL_FLAG(absl::Duration, last_call_timeout, absl::Seconds(30),
          "once MIN nodes joined, how long the round waits for more");
ABSL_FLAG(absl::Duration, bootstrap_timeout, absl::Minutes(2),
          "how long the key-value bootstrap waits for the other ranks");

namespace gradsync {
namespace {

absl::StatusOr<v1::JoinRequest> BuildRequestFromFlags() {
  JoinConfig config;
  config.job_id = absl::GetFlag(FLAGS_job);
  config.nnodes = absl::GetFlag(FLAGS_nnodes);
  config.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  config.node_id = absl::GetFlag(FLAGS_node_id);
  config.backend = absl::GetFlag(FLAGS_backend);
  config.join_timeout = absl::GetFlag(FLAGS_join_timeout);
  config.last_call_timeout = absl::GetFlag(FLAGS_last_call_timeout);
  config.address = "127.0.0.1";
  // A simulated worker claims what --device says without probing it.
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cuda") {
    config.device_type = v1::DEVICE_TYPE_CUDA;
    config.device_count = 1;
    config.nccl_available = true;
  } else if (device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got '", device, "'"));
  }
  return BuildJoinRequest(config);
}

// The bootstrap a real backend performs through the store.
absl::Status Bootstrap(CoordinatorClient& client, const v1::Assignment& a,
                       const v1::NodeDescriptor& node) {
  v1::Scope scope;
  scope.set_job_id(a.job_id());
  scope.set_round(a.round());
  const absl::Duration timeout = absl::GetFlag(FLAGS_bootstrap_timeout);
  GS_RETURN_IF_ERROR(client.Set(
      scope, absl::StrCat("addr/", a.rank()),
      absl::StrCat(node.addresses(0), " pid ", node.pid())));
  if (a.rank() == 0) {
    GS_RETURN_IF_ERROR(client.Set(scope, "comm_id", NewIncarnationId()));
  }
  std::vector<std::string> keys = {"comm_id"};
  for (int r = 0; r < a.world_size(); ++r) {
    keys.push_back(absl::StrCat("addr/", r));
  }
  GS_RETURN_IF_ERROR(client.Wait(scope, keys, timeout));
  GS_ASSIGN_OR_RETURN(std::string comm_id, client.Get(scope, "comm_id"));
  GS_ASSIGN_OR_RETURN(int64_t arrived, client.Add(scope, "barrier", 1));
  if (arrived == a.world_size()) {
    GS_RETURN_IF_ERROR(client.Set(scope, "barrier_done", "1"));
  }
  GS_RETURN_IF_ERROR(client.Wait(scope, {"barrier_done"}, timeout));
  std::printf(
      "rank %d/%d (local %d/%d, node %d/%d) round %lld backend %s: "
      "bootstrapped communicator %s\n",
      a.rank(), a.world_size(), a.local_rank(), a.local_world_size(),
      a.node_rank(), a.num_nodes(), static_cast<long long>(a.round()),
      BackendName(a.backend()).c_str(), comm_id.substr(0, 8).c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Run() {
  GS_ASSIGN_OR_RETURN(v1::JoinRequest request, BuildRequestFromFlags());
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_coordinator);
  GS_ASSIGN_OR_RETURN(auto client, CoordinatorClient::Create(options));
  GS_ASSIGN_OR_RETURN(v1::Assignment assignment, client->Join(request));
  return Bootstrap(*client, assignment, request.node());
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gradsync-sim-worker --coordinator=HOST:PORT --job=NAME "
      "--nnodes=MIN[:MAX]");
  absl::ParseCommandLine(argc, argv);
  absl::Status status = gradsync::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "gradsync-sim-worker: %s\n",
                 std::string(status.message()).c_str());
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
