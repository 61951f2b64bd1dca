// The simulated device: an NcclDevice in host memory that keeps CUDA's
// asynchrony, so that the NCCL backend's own code runs multi-rank, with
// hangs, asynchronous errors and aborts, on machines without a GPU (CI).
//
//  - A stream is a thread that runs the work queued on it in order; a
//    collective, an event record, a wait or a host function is queued and
//    the call returns at once. The null (legacy default) stream stands for
//    the host: what is queued on it is done already (the CPU tensors of
//    `gradsync-worker --device=sim` are computed synchronously), and a wait
//    on it blocks the calling thread.
//  - Events complete when their stream reaches them, and complete whether
//    or not the collective before them succeeded, as CUDA's do: only the
//    communicator's asynchronous state tells a failed collective apart.
//  - A communicator's collectives run, on its stream's thread, over a
//    shared-memory backend (ShmBackend) among the ranks, which may be threads
//    of one process or processes of one host; its unique id names a
//    directory that the ranks bootstrap through (FileStore). A peer that
//    leaves or aborts fails the collectives in flight with it (the
//    communicator's asynchronous error); a peer that never enters one hangs
//    it until this rank aborts, as on a GPU.
//  - Memory is host memory; MemoryInUse is what this device object has
//    allocated and not freed.
#ifndef GRADSYNC_WORKER_BACKEND_SIM_DEVICE_H_
#define GRADSYNC_WORKER_BACKEND_SIM_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend/nccl_device.h"

namespace gradsync {

// Simulated devices per node: $GRADSYNC_SIM_DEVICES, default 8.
// INVALID_ARGUMENT when the variable is set but not a count in [1, 1024].
absl::StatusOr<int> SimDeviceCount();

// Simulated device `index` ("sim:INDEX"); INVALID_ARGUMENT when `index` is
// not in [0, SimDeviceCount()).
absl::StatusOr<std::unique_ptr<NcclDevice>> CreateSimDevice(int index);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_SIM_DEVICE_H_
