// The seam under the NCCL backend: the NCCL and CUDA calls NcclBackend makes,
// behind two small interfaces, so that the backend's logic (ordering after
// the caller's stream, completion, the watchdog, abort, re-creation) is the
// same code on a GPU and on the simulated device that runs it without one.
//
//   NcclDevice  one device of this process: streams, events, host functions
//               on a stream, memory, and starting a communicator on it.
//   NcclComm    one rank's communicator: collectives enqueued on a stream,
//               the asynchronous error state, abort.
//
// Implementations: CudaNcclDevice (cuda_nccl_device.h, a thin layer over the
// CUDA runtime and NCCL, built where CUDA is found) and SimDevice
// (sim_device.h: host memory, a thread per stream, collectives over shared
// memory between threads or processes). Streams and events are opaque
// handles (a cudaStream_t / cudaEvent_t for CUDA), as in CUDA: a null stream
// is the legacy default stream. The semantics are CUDA's throughout: work on
// one stream runs in order, asynchronously to the host; an event completes
// when its stream reaches the point it was recorded at; a stream that waits
// for an event runs nothing queued after the wait until then.
#ifndef GRADSYNC_WORKER_BACKEND_NCCL_DEVICE_H_
#define GRADSYNC_WORKER_BACKEND_NCCL_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"

namespace gradsync {

// One rank's communicator, created non-blocking (NcclDevice::StartComm).
// Every call but Abort() returns at once: a collective is only enqueued on
// `stream` and runs when the stream reaches it. Thread-safe: Abort() may race
// any other call (it waits for a call in progress to return, never for the
// device). The destructor frees a healthy communicator after the work
// already enqueued (the caller drains its stream first) and only releases an
// aborted one.
class NcclComm {
 public:
  virtual ~NcclComm() = default;

  // Where the communicator's last call (its creation, or an enqueue) stands:
  // true once settled without error, false while still in progress, the
  // error once one was seen (an asynchronous error of a collective that
  // already left the host, a peer lost, a failed creation). Cheap; the
  // watchdog polls it.
  virtual absl::StatusOr<bool> Settled() = 0;

  // ncclCommAbort: collectives in flight on the device end (their stream
  // moves on, their output undefined), peers in a collective with this rank
  // fail, and every later call fails. Idempotent.
  virtual void Abort() = 0;

  // In place when send == recv. `stream` as the device's handles.
  virtual absl::Status AllReduce(const void* send, void* recv, size_t count,
                                 DataType dtype, ReduceOp op,
                                 void* stream) = 0;
  virtual absl::Status Broadcast(const void* send, void* recv, size_t count,
                                 DataType dtype, int root, void* stream) = 0;
  // `recv` holds world_size * count elements, in rank order.
  virtual absl::Status AllGather(const void* send, void* recv, size_t count,
                                 DataType dtype, void* stream) = 0;
};

// One device of this process (a GPU, or a simulated one). Thread-safe.
// Lifetime: outlives every stream, event, allocation and communicator made
// on it; gradsync keeps one for the whole life of the process, so a process
// never changes device between rounds.
class NcclDevice {
 public:
  virtual ~NcclDevice() = default;

  // "cuda:0", "sim:3".
  virtual std::string name() const = 0;
  virtual int index() const = 0;
  // Where the buffers of this device's collectives live: kCuda for a GPU;
  // kCpu (host memory) for the simulated device.
  virtual DeviceKind buffer_kind() const = 0;

  // Makes this the calling thread's current device (cudaSetDevice).
  virtual absl::Status MakeCurrent() = 0;

  // A stream that runs its work asynchronously to the host and to other
  // streams. DestroyStream lets the work already queued finish first; the
  // CUDA device keeps the stream for reuse rather than destroying it (PyTorch's
  // allocator may still record events on it: cuda_nccl_device.cc).
  virtual absl::StatusOr<void*> CreateStream() = 0;
  virtual void DestroyStream(void* stream) = 0;

  // An event whose host waits block rather than spin; with `timing`, one
  // that ElapsedTime can measure between.
  virtual absl::StatusOr<void*> CreateEvent(bool timing) = 0;
  virtual void DestroyEvent(void* event) = 0;
  virtual absl::Status RecordEvent(void* event, void* stream) = 0;
  // Whether the work the event was last recorded after has completed (true
  // for an event never recorded).
  virtual absl::StatusOr<bool> EventDone(void* event) = 0;
  // Blocks the calling thread until EventDone, without spinning.
  virtual absl::Status SynchronizeEvent(void* event) = 0;
  // The device time between two done timing events (cudaEventElapsedTime).
  virtual absl::StatusOr<absl::Duration> ElapsedTime(void* start,
                                                     void* end) = 0;
  // Work queued on `stream` after this call runs once `event` is done.
  virtual absl::Status StreamWaitEvent(void* stream, void* event) = 0;
  // Runs `fn` on a host thread when `stream` reaches this point; the
  // stream's later work waits until `fn` returns (cudaLaunchHostFunc). `fn`
  // must not call this device.
  virtual absl::Status LaunchHostFunction(void* stream,
                                          std::function<void()> fn) = 0;

  // Device memory.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* data) = 0;
  // Bytes in use on the device (for a GPU: total minus free, so every
  // process's; for the simulated device: what this process allocated on
  // it); 0 when unknown.
  virtual int64_t MemoryInUse() = 0;

  // A fresh unique id for a new communicator (ncclGetUniqueId): one rank
  // makes it and hands it to the others through a Store.
  virtual absl::StatusOr<std::string> NewUniqueId() = 0;
  // Starts creating rank `rank`'s communicator of `world_size` ranks named
  // by `unique_id`; returns at once with a communicator whose Settled() is
  // false until every rank has joined (then true) or creation failed.
  // Abort() ends a creation that waits for a rank that never comes.
  virtual absl::StatusOr<std::unique_ptr<NcclComm>> StartComm(
      const std::string& unique_id, int world_size, int rank) = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_NCCL_DEVICE_H_
