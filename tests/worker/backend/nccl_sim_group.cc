#include "tests/worker/backend/nccl_sim_group.h"

#include <utility>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "worker/backend/sim_device.h"

namespace gradsync {
namespace testing {

std::vector<std::unique_ptr<NcclDevice>> SimDevices(int world_size) {
  std::vector<std::unique_ptr<NcclDevice>> devices;
  for (int rank = 0; rank < world_size; ++rank) {
    auto device = CreateSimDevice(rank);
    EXPECT_TRUE(device.ok()) << device.status();
    devices.push_back(device.ok() ? *std::move(device) : nullptr);
  }
  return devices;
}

std::vector<std::unique_ptr<NcclBackend>> StartNcclGroup(
    const std::vector<std::unique_ptr<NcclDevice>>& devices, Store* store,
    absl::Duration timeout,
    const std::function<CommFaultPlan(int rank)>& faults) {
  const int world_size = static_cast<int>(devices.size());
  return StartGroup<NcclBackend>(
      world_size,
      [&](int rank) -> absl::StatusOr<std::unique_ptr<NcclBackend>> {
        NcclOptions nccl;
        nccl.device = devices[rank].get();
        if (faults) nccl.faults = faults(rank);
        auto backend = NcclBackend::Create(
            OptionsFor(rank, world_size, timeout), nccl);
        if (!backend.ok()) return backend.status();
        absl::Status connected = (*backend)->Connect(store);
        if (!connected.ok()) return connected;
        return backend;
      });
}

CommFaultPlan FaultAt(uint64_t n, CommFault::Kind kind) {
  return [n, kind](uint64_t collective) {
    CommFault fault;
    if (collective == n) fault.kind = kind;
    return fault;
  };
}

}  // namespace testing
}  // namespace gradsync
