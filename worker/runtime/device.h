// The device a worker process trains on: the CPU, a CUDA GPU, or a
// simulated GPU (host memory through every GPU code path, NCCL over shared
// memory; for tests without a GPU). A process picks its device once and
// keeps it for its whole life, across rounds.
#ifndef GRADSYNC_WORKER_RUNTIME_DEVICE_H_
#define GRADSYNC_WORKER_RUNTIME_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "proto/gradsync/v1/job.pb.h"
#include "worker/backend/nccl_device.h"

namespace gradsync {

// The devices of `type` this process sees: CUDA's count (0 in a build
// without CUDA), GRADSYNC_SIM_DEVICES for simulated ones, 0 for the CPU.
absl::StatusOr<int> VisibleDevices(v1::DeviceType type);

// Whether this process can run NCCL on devices of `type`: a CUDA build with
// a GPU, or any simulated device.
bool NcclAvailable(v1::DeviceType type);

// Device `index` of `type` for the NCCL backend (CUDA or simulated).
// FAILED_PRECONDITION for the CPU, or CUDA in a build without it; the
// device's own errors (an index out of range).
absl::StatusOr<std::unique_ptr<NcclDevice>> OpenNcclDevice(v1::DeviceType type,
                                                           int index);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_DEVICE_H_
