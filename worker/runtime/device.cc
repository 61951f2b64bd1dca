#include "worker/runtime/device.h"

#include "absl/strings/str_cat.h"
#include "worker/backend/sim_device.h"
#ifdef GRADSYNC_HAS_NCCL
#include "worker/backend/cuda_nccl_device.h"
#endif

namespace gradsync {

absl::StatusOr<int> VisibleDevices(v1::DeviceType type) {
  switch (type) {
    case v1::DEVICE_TYPE_CUDA:
#ifdef GRADSYNC_HAS_NCCL
      return CudaDeviceCount();
#else
      return 0;
#endif
    case v1::DEVICE_TYPE_SIM:
      return SimDeviceCount();
    default:
      return 0;
  }
}

bool NcclAvailable(v1::DeviceType type) {
  if (type == v1::DEVICE_TYPE_SIM) return true;
  if (type != v1::DEVICE_TYPE_CUDA) return false;
  absl::StatusOr<int> count = VisibleDevices(type);
  return count.ok() && *count > 0;
}

absl::StatusOr<std::unique_ptr<NcclDevice>> OpenNcclDevice(v1::DeviceType type,
                                                           int index) {
  switch (type) {
    case v1::DEVICE_TYPE_SIM:
      return CreateSimDevice(index);
    case v1::DEVICE_TYPE_CUDA:
#ifdef GRADSYNC_HAS_NCCL
      return CreateCudaNcclDevice(index);
#else
      return absl::FailedPreconditionError(
          "this gradsync was built without CUDA and NCCL (none found at build "
          "time): train on the CPU with gloo, or on --device=sim");
#endif
    default:
      return absl::FailedPreconditionError(
          "the NCCL backend needs a GPU (--device=cuda) or a simulated one "
          "(--device=sim)");
  }
}

}  // namespace gradsync
