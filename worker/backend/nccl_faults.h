// Faults injected into a communicator's collectives, over the NcclComm seam,
// so that they reach the NCCL backend exactly as NCCL's own would, on a GPU
// and on the simulated device alike: tests give a plan per rank, and
// gradsync-worker's failpoints nccl_async_error:N and nccl_hang:N give one
// per process.
#ifndef GRADSYNC_WORKER_BACKEND_NCCL_FAULTS_H_
#define GRADSYNC_WORKER_BACKEND_NCCL_FAULTS_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "worker/backend/nccl_device.h"

namespace gradsync {

// What happens to one collective.
struct CommFault {
  enum class Kind {
    kNone,
    // The collective is enqueued and the host moves on; when the stream
    // reaches it, it ends without reducing anything (the buffer keeps this
    // rank's own data) and the communicator reports an asynchronous error,
    // as a failed NCCL kernel or network proxy would.
    kAsyncError,
    // The collective never completes (its stream blocks) until the
    // communicator is aborted: a peer that never entered it, seen from here.
    kHang,
    // The collective starts `delay` late on its stream: a slow rank.
    kDelay,
  };
  Kind kind = Kind::kNone;
  absl::Duration delay;
};

// Decides the fault of the n-th collective (1, 2, ...) a communicator
// issues. Called on the thread that issues it.
using CommFaultPlan = std::function<CommFault(uint64_t collective)>;

// `comm` with `plan`'s faults injected; `device` (its streams' host
// functions carry the faults) must outlive the result. Settled() reports an
// injected error once its collective's stream has reached it; Abort() also
// ends an injected hang. Thread-safe as NcclComm.
std::unique_ptr<NcclComm> InjectCommFaults(std::unique_ptr<NcclComm> comm,
                                           NcclDevice* device,
                                           CommFaultPlan plan);

// The faults this process's armed failpoints ask for (common/failpoint.h):
// every collective the plan is asked about is one pass through each of
// nccl_async_error and nccl_hang, counted independently, so that
// "nccl_hang:N" fires on the N-th collective whether or not
// nccl_async_error fired before it. A collective both fire on gets the
// asynchronous error (it ends the collective, as the abort that follows
// would end the hang). Null when neither is armed. The plan is process-wide
// (its counts are the failpoints'): give it to every communicator.
CommFaultPlan FailpointCommFaults();

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_NCCL_FAULTS_H_
