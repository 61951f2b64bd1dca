// Builds the communication backend a closed round negotiated, bootstrapped
// through the coordinator's key-value store of that round.
#ifndef GRADSYNC_WORKER_RUNTIME_PROCESS_GROUP_H_
#define GRADSYNC_WORKER_RUNTIME_PROCESS_GROUP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "worker/backend/backend.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/nccl_faults.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {

struct ProcessGroupOptions {
  // Bootstrap and per-collective timeout.
  absl::Duration timeout = absl::Minutes(5);
  // Gloo: the address this process registered with the coordinator (its
  // NodeDescriptor's first address); it binds and advertises it.
  std::string address = "127.0.0.1";
  // Gloo: a network interface to bind instead (e.g. "eth0").
  std::string network_interface;
  // A Gloo round whose ranks are all on one node (or one host:
  // Assignment.single_host) runs its collectives through shared memory
  // (ShmBackend) instead of TCP loopback. Every rank
  // of the round must pass the same value.
  bool shared_memory = true;
  // NCCL: the device of this process (a GPU or a simulated one; it must
  // outlive the backend), the stream its collectives wait for when a buffer
  // names none (nullptr: the default stream, LibTorch's default), and faults
  // to inject (failpoints).
  NcclDevice* nccl_device = nullptr;
  void* stream = nullptr;
  CommFaultPlan nccl_faults;
  // Called with the backend as soon as it exists, before it connects, so
  // that another thread can Abort() a bootstrap that waits for a rank that
  // never comes (NCCL's communicator creation); and with nullptr before the
  // backend is destroyed because it failed to connect.
  std::function<void(Backend*)> on_backend;
  // When given, a shared-memory round's bootstrap stops waiting for the
  // other ranks to attach once it is set (CANCELLED), for a peer that died
  // before it attached: the shared-memory backend exists only once every
  // rank attached, so on_backend cannot abort that wait. Must outlive
  // CreateProcessGroup.
  const std::atomic<bool>* cancel = nullptr;
};

// Creates the backend `assignment` names (Gloo or NCCL) for its rank and
// world size; blocks until every rank of the round has connected. For Gloo
// on a single-node round, the shared-memory backend (see
// `options.shared_memory`).
// Collective: every member of the round calls it. FAILED_PRECONDITION when
// the round chose NCCL and this process has no NCCL device; ABORTED when the
// round has been superseded or the bootstrap was aborted; otherwise the
// backend's own errors.
absl::StatusOr<std::unique_ptr<Backend>> CreateProcessGroup(
    CoordinatorClient* client, const v1::Assignment& assignment,
    const ProcessGroupOptions& options);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_PROCESS_GROUP_H_
