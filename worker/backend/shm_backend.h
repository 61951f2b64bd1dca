// The shared-memory backend: collectives on CPU buffers among the ranks of
// one host (processes, or threads of one process), through one POSIX
// shared-memory segment that every rank maps. No socket and no kernel copy:
// a rank copies its data into its slot of the segment, the ranks reduce
// their share of every slot in parallel, and each copies the result out.
#ifndef GRADSYNC_WORKER_BACKEND_SHM_BACKEND_H_
#define GRADSYNC_WORKER_BACKEND_SHM_BACKEND_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/serial_op_queue.h"
#include "worker/backend/store.h"

namespace gradsync {
namespace shm_internal {
// The mapped segment and the barrier on it (shm_segment.h).
class Segment;
}  // namespace shm_internal

struct ShmOptions {
  // Bytes of each rank's slot in the segment (rounded up to 64). A larger
  // collective runs in chunks of this size, two barriers each, so small
  // slots cost barriers and large ones cache misses. The segment holds
  // world_size + 1 slots and is reserved in /dev/shm up front (so a full
  // /dev/shm fails Create instead of crashing a collective with SIGBUS).
  // Every rank must pass the same value.
  size_t slot_bytes = size_t{4} << 20;
  // When given, Create stops waiting for the other ranks to attach once it
  // is set (CANCELLED), e.g. from a thread that aborts a bootstrap. Must
  // outlive Create.
  const std::atomic<bool>* cancel = nullptr;
};

// A Backend over shared memory, for ranks on one host.
//
// Buffers must be on the CPU. AllReduce takes every dtype: float32, float64,
// int32, int64 and uint8 are summed in their own type (integers wrap around
// on overflow), float16 and bfloat16 are summed in float32 and rounded once
// (to nearest even). kAverage is the sum divided by the world size
// (integers truncate toward zero), as in GlooBackend. Broadcast and
// AllGather copy bytes.
//
// Collectives run one at a time, in issue order, on one background thread
// owned by the backend. Each gets a sequence number (1, 2, ..., named in
// messages: "shm allreduce #17 (rank 2 of 4): ...") and completes its Work
// with:
//  - OK;
//  - DEADLINE_EXCEEDED when a peer did not take part within
//    options().timeout (each wait for the peers has that bound; the message
//    names the ranks that were missing);
//  - UNAVAILABLE when a peer left: its process exited, or its backend was
//    destroyed or failed;
//  - INTERNAL when the ranks issued different collectives at this sequence
//    number (the message names both);
//  - ABORTED for every collective issued after one of the failures above:
//    the failing rank marks the segment so that peers waiting on it fail at
//    once with UNAVAILABLE rather than at their timeout, and the round must
//    go on with a new backend;
//  - CANCELLED when the backend is destroyed before the collective ended.
// Argument errors return a Work already finished with INVALID_ARGUMENT that
// consumes no sequence number. A collective of zero elements touches no
// shared memory and completes OK, in order with the others.
//
// Thread-safe: collectives may be issued from any thread; those issued
// concurrently run in the order their calls took the backend's lock, so a
// caller must serialize issuing to keep the order identical on all ranks.
// Buffers must stay valid until their Work completes.
class ShmBackend final : public Backend {
 public:
  // Rank 0 creates the segment (a random name, mode 0600) and publishes its
  // name through `store` under the key "shm_name" (give each backend its own
  // namespace, such as a CoordinatorStore prefix); the other ranks read it
  // and map the segment. `store` is used only during this call. Blocks until
  // all `options.world_size` ranks have attached, then removes the name, so
  // nothing is left in /dev/shm however the processes end later. Errors:
  // INVALID_ARGUMENT for a bad rank, world size, timeout or slot size, or
  // when the ranks disagree on the world size or slot size; the store's own
  // error (e.g. DEADLINE_EXCEEDED naming the missing key); DEADLINE_EXCEEDED
  // naming the ranks that did not attach within options.timeout;
  // UNAVAILABLE when a rank's process exited or its bootstrap failed
  // meanwhile; NOT_FOUND when the segment is not there (the ranks are not on
  // one host, or do not share /dev/shm); RESOURCE_EXHAUSTED when /dev/shm has
  // no room. Only a rank 0 that dies inside Create before any other rank has
  // opened the segment can leave it behind in /dev/shm.
  static absl::StatusOr<std::unique_ptr<ShmBackend>> Create(
      const BackendOptions& options, Store* store,
      ShmOptions shm_options = ShmOptions());

  // Fails the collectives that have not started with CANCELLED, stops the
  // one in flight (CANCELLED too) and the background thread, and marks the
  // segment so that peers in or entering a collective with this rank fail
  // with UNAVAILABLE. Then unmaps the segment.
  ~ShmBackend() override;

  std::string name() const override { return "shm"; }

  std::shared_ptr<Work> AllReduce(Buffer buffer, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(Buffer buffer, int root) override;
  std::shared_ptr<Work> AllGather(Buffer input, Buffer output) override;
  std::shared_ptr<Work> Barrier() override;
  // The collective in flight stops waiting (CANCELLED) within one futex
  // sleep; peers see this rank leave (UNAVAILABLE).
  void Abort() override;

  // The name the segment had ("/gradsync-shm-..."); it is already removed
  // from /dev/shm when Create returns.
  const std::string& segment_name() const;

 private:
  ShmBackend(const BackendOptions& options,
             std::unique_ptr<shm_internal::Segment> segment);

  // Queues a validated collective. `run` (empty for no elements) runs on the
  // queue's thread; a failure marks the segment (see the class comment).
  std::shared_ptr<Work> Enqueue(const char* collective,
                                SerialOpQueue::RunFn run);

  absl::Status RunAllReduce(uint64_t sequence, const std::string& where,
                            const Buffer& buffer, ReduceOp op);
  absl::Status RunBroadcast(uint64_t sequence, const std::string& where,
                            const Buffer& buffer, int root);
  absl::Status RunAllGather(uint64_t sequence, const std::string& where,
                            const Buffer& input, const Buffer& output);
  absl::Status RunBarrier(uint64_t sequence, const std::string& where);

  // Mapped for the backend's whole life; used only by the queue's thread,
  // except for the destructor's Leave().
  const std::unique_ptr<shm_internal::Segment> segment_;
  // Set by Abort() and the destructor: the collective in flight stops
  // waiting.
  std::atomic<bool> closing_{false};

  // Declared last: started once every other member is ready.
  SerialOpQueue queue_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_SHM_BACKEND_H_
