// The real NcclDevice: a thin layer over the CUDA runtime and NCCL, one call
// each. Built only where CUDA and NCCL are found (bazel/cuda_configure.bzl,
// cmake/GradsyncCuda.cmake); callers check GRADSYNC_HAS_CUDA.
#ifndef GRADSYNC_WORKER_BACKEND_CUDA_NCCL_DEVICE_H_
#define GRADSYNC_WORKER_BACKEND_CUDA_NCCL_DEVICE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend/nccl_device.h"

namespace gradsync {

// CUDA device `index` of this process. FAILED_PRECONDITION when the process
// sees no CUDA device; INVALID_ARGUMENT when `index` is not one of them.
absl::StatusOr<std::unique_ptr<NcclDevice>> CreateCudaNcclDevice(int index);

// The number of CUDA devices this process can use (0 without a driver).
int CudaDeviceCount();

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_CUDA_NCCL_DEVICE_H_
