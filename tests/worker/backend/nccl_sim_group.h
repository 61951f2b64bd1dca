// NCCL backends on simulated devices (sim_device.h), ranks as threads of the
// test process: what the NCCL backend's own tests and the tests above it
// (DDP on the simulated device) share.
#ifndef GRADSYNC_TESTS_WORKER_BACKEND_NCCL_SIM_GROUP_H_
#define GRADSYNC_TESTS_WORKER_BACKEND_NCCL_SIM_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "tests/worker/backend/backend_test_util.h"
#include "worker/backend/nccl_backend.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/nccl_faults.h"
#include "worker/backend/store.h"

namespace gradsync {
namespace testing {

// The simulated devices of one node, one per rank (index = rank); a device
// that could not be made is null, and the test has failed.
std::vector<std::unique_ptr<NcclDevice>> SimDevices(int world_size);

// Connects the NCCL backends of devices.size() ranks, rank r on devices[r],
// each on its own thread, through `store`; `faults(rank)` gives a rank's
// fault plan (none when null). Empty, and the test has failed, when a rank
// could not connect. The devices and the store must outlive the call; the
// devices must outlive the backends.
std::vector<std::unique_ptr<NcclBackend>> StartNcclGroup(
    const std::vector<std::unique_ptr<NcclDevice>>& devices, Store* store,
    absl::Duration timeout = kHealthyTimeout,
    const std::function<CommFaultPlan(int rank)>& faults = nullptr);

// A plan that gives collective `n` (1, 2, ...) of every communicator
// `kind`, and every other one none.
CommFaultPlan FaultAt(uint64_t n, CommFault::Kind kind);

}  // namespace testing
}  // namespace gradsync

#endif  // GRADSYNC_TESTS_WORKER_BACKEND_NCCL_SIM_GROUP_H_
