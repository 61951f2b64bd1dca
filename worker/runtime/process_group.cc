#include "worker/runtime/process_group.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/backend/gloo_backend.h"
#include "worker/backend/shm_backend.h"
#include "worker/backend/nccl_backend.h"
#include "worker/runtime/coordinator_store.h"

namespace gradsync {
namespace {

// An NCCL backend on `options.nccl_device`, abortable while it connects.
absl::StatusOr<std::unique_ptr<Backend>> CreateNccl(
    const BackendOptions& backend_options, Store* store,
    const ProcessGroupOptions& options) {
  if (options.nccl_device == nullptr) {
    return absl::FailedPreconditionError(
        "the round chose NCCL but this process trains on the CPU: start it "
        "with --device=cuda (or --device=sim), or join with --backend=gloo");
  }
  NcclOptions nccl;
  nccl.device = options.nccl_device;
  nccl.compute_stream = options.stream;
  nccl.faults = options.nccl_faults;
  GS_ASSIGN_OR_RETURN(std::unique_ptr<NcclBackend> backend,
                      NcclBackend::Create(backend_options, nccl));
  if (options.on_backend) options.on_backend(backend.get());
  absl::Status connected = backend->Connect(store);
  if (!connected.ok()) {
    if (options.on_backend) options.on_backend(nullptr);
    return connected;
  }
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateProcessGroup(
    CoordinatorClient* client, const v1::Assignment& assignment,
    const ProcessGroupOptions& options) {
  BackendOptions backend_options;
  backend_options.rank = assignment.rank();
  backend_options.world_size = assignment.world_size();
  backend_options.timeout = options.timeout;
  v1::Scope scope;
  scope.set_job_id(assignment.job_id());
  scope.set_round(assignment.round());
  const bool shared_memory =
      assignment.backend() == v1::BACKEND_GLOO && options.shared_memory &&
      (assignment.num_nodes() == 1 || assignment.single_host());
  const std::string name =
      shared_memory ? "shm" : BackendName(assignment.backend());
  // One key namespace per backend kind within the round's scope.
  CoordinatorStore store(client, scope, absl::StrCat("pg/", name, "/"));
  GS_LOG(INFO) << "rank " << assignment.rank() << "/"
               << assignment.world_size() << " of round "
               << assignment.round() << ": connecting " << name
               << (shared_memory ? " (gloo round on one host: shared memory)"
                                 : "");

  if (shared_memory) {
    // Large slots mean fewer chunks, so fewer cross-process barriers per
    // bucket (each costs a wake-up when the machine is busy); the segment,
    // (W + 1) slots, stays within 48 MiB so that it fits a container's
    // default 64 MiB /dev/shm. Every rank computes the same size.
    ShmOptions shm;
    shm.slot_bytes = std::clamp<size_t>(
        (size_t{48} << 20) / (assignment.world_size() + 1), size_t{1} << 20,
        size_t{16} << 20);
    shm.cancel = options.cancel;
    auto backend = ShmBackend::Create(backend_options, &store, shm);
    if (!backend.ok()) {
      return absl::Status(
          backend.status().code(),
          absl::StrCat(backend.status().message(),
                       " (every process of this one-node round must run on "
                       "one host; pass --shared_memory=false to use TCP)"));
    }
    return std::unique_ptr<Backend>(std::move(*backend));
  }
  switch (assignment.backend()) {
    case v1::BACKEND_GLOO: {
      GlooOptions gloo;
      gloo.hostname = options.address;
      gloo.network_interface = options.network_interface;
      auto backend = GlooBackend::Create(backend_options, &store, gloo);
      if (!backend.ok()) return backend.status();
      return std::unique_ptr<Backend>(std::move(*backend));
    }
    case v1::BACKEND_NCCL:
      return CreateNccl(backend_options, &store, options);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "the coordinator assigned backend ", name,
          ", which this worker does not know"));
  }
}

}  // namespace gradsync
