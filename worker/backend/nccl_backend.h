// The NCCL backend, for CUDA buffers. Built only where CUDA and NCCL are
// found (see bazel/cuda_configure.bzl); callers check GRADSYNC_HAS_NCCL.
//
// Bootstrap: rank 0 creates the NCCL unique id and publishes it through the
// Store; the others read it; the communicator is created non-blocking so a
// rank that never arrives fails the creation after the timeout instead of
// hanging it.
//
// Execution: each collective waits (on the GPU, via an event) for the work
// already queued on the caller's stream (Buffer::stream: the current stream
// of the tensor's device, as c10d orders after it; else the compute stream),
// then runs on the backend's own communication stream; an event recorded
// after it completes the Work, and Work::SynchronizeStream makes a caller's
// stream wait on that event instead of blocking the host. A
// watchdog thread polls those events and ncclCommGetAsyncError: on an
// asynchronous NCCL error, or a collective older than the timeout, it aborts
// the communicator and fails every pending Work with a message naming the
// collective, instead of letting the job hang.
#ifndef GRADSYNC_WORKER_BACKEND_NCCL_BACKEND_H_
#define GRADSYNC_WORKER_BACKEND_NCCL_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/store.h"

namespace gradsync {

struct NcclOptions {
  // The CUDA device this rank uses.
  int device_index = 0;
  // The stream (a cudaStream_t) whose queued work a collective waits for
  // when its buffer names none; nullptr is the legacy default stream.
  void* compute_stream = nullptr;
};

// Creates the communicator of `options.rank` in `options.world_size`,
// bootstrapping through `store` (which must outlive the call only).
// FAILED_PRECONDITION without a CUDA device; DEADLINE_EXCEEDED when the other
// ranks do not arrive within options.timeout. The backend is thread-safe.
absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    const BackendOptions& options, Store* store,
    const NcclOptions& nccl_options);

// The number of CUDA devices this process can use (0 without a driver).
int CudaDeviceCount();

// Memory in use on CUDA device `device_index`, bytes (total minus free: with
// one training process per GPU, that process's usage); 0 when unknown.
int64_t CudaDeviceMemoryInUse(int device_index);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_NCCL_BACKEND_H_
