// The Gloo backend: collectives on CPU buffers over TCP, through Debian's
// libgloo. Ranks bootstrap through a Store (each publishes its listening
// addresses, then connects to every other rank: a full mesh).
#ifndef GRADSYNC_WORKER_BACKEND_GLOO_BACKEND_H_
#define GRADSYNC_WORKER_BACKEND_GLOO_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/serial_op_queue.h"
#include "worker/backend/store.h"

namespace gradsync {

class AbortableGlooContext;

// Where this rank's Gloo device listens. The address is published through
// the store, so it must be one the other ranks can reach.
struct GlooOptions {
  // Host name or IP address to bind and advertise. Tests use loopback; a
  // worker passes the address it registered with the coordinator.
  std::string hostname = "127.0.0.1";
  // Network interface to bind instead (e.g. "eth0"); when set, `hostname`
  // is ignored. With both empty, Gloo binds the address this machine's
  // hostname resolves to.
  std::string network_interface;
};

// A Backend over Gloo's TCP transport.
//
// Buffers must be on the CPU. AllReduce takes float32, float64, float16,
// int32, int64 and uint8 (bfloat16 gives INVALID_ARGUMENT "gloo backend does
// not support dtype bfloat16"); kAverage is Gloo's sum divided by the world
// size on this CPU (integers truncate; uint8 sums wrap around). Broadcast and
// AllGather copy bytes, so they take every dtype.
//
// Collectives run one at a time, in issue order, on one background thread
// owned by the backend. Each gets a sequence number (1, 2, ...; also its Gloo
// tag, and named in messages: "gloo allreduce #17 (rank 2 of 4): ...") and
// completes its Work with:
//  - OK;
//  - DEADLINE_EXCEEDED when a peer did not take part within
//    options().timeout;
//  - UNAVAILABLE when a connection broke (a peer died, timed out or was
//    destroyed);
//  - INTERNAL for any other Gloo error;
//  - ABORTED for every collective issued after one of the three failures
//    above: this rank then closes all its connections (so that peers still
//    waiting on it fail at once with UNAVAILABLE rather than at their
//    timeout), and the round must go on with a new backend;
//  - CANCELLED when the backend is destroyed before the collective started.
// Argument errors return a Work already finished with INVALID_ARGUMENT that
// consumes no sequence number. A collective of zero elements runs no Gloo
// code and completes OK, in order with the others.
//
// Gloo writes to sockets without MSG_NOSIGNAL; the threads that write on
// this backend's sockets block SIGPIPE, so a peer's death surfaces as
// UNAVAILABLE instead of killing the process. The process's SIGPIPE
// disposition is left alone.
//
// Thread-safe: collectives may be issued from any thread; those issued
// concurrently run in the order their calls took the backend's lock, so a
// caller must serialize issuing to keep the order identical on all ranks.
// Buffers must stay valid until their Work completes.
class GlooBackend final : public Backend {
 public:
  // Creates the Gloo context of rank `options.rank` and connects it to every
  // other rank through `store`, which is used only during this call (keys
  // "0", "1", ...: give each backend its own namespace, such as a
  // CoordinatorStore prefix). Blocks until all `options.world_size` ranks
  // have connected, or fails after `options.timeout`. Errors:
  // INVALID_ARGUMENT for a bad rank, world size, timeout or address; the
  // store's own error (e.g. DEADLINE_EXCEEDED naming the missing keys, or
  // ABORTED for a stale round); UNAVAILABLE/DEADLINE_EXCEEDED when a peer
  // cannot be connected to.
  static absl::StatusOr<std::unique_ptr<GlooBackend>> Create(
      const BackendOptions& options, Store* store,
      GlooOptions gloo_options = GlooOptions());

  // Fails the collectives that have not started with CANCELLED, waits for the
  // one in flight (bounded by options().timeout, which Gloo enforces), stops
  // the background thread and closes every connection, so peers in or
  // entering a collective with this rank fail with UNAVAILABLE.
  ~GlooBackend() override;

  std::string name() const override { return "gloo"; }

  std::shared_ptr<Work> AllReduce(Buffer buffer, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(Buffer buffer, int root) override;
  std::shared_ptr<Work> AllGather(Buffer input, Buffer output) override;
  std::shared_ptr<Work> Barrier() override;
  // Fails every connection: the collective in flight fails (UNAVAILABLE,
  // "the gloo backend was aborted on this rank"), also one whose message a
  // dead peer cut short (which Gloo alone leaves to its timeout), and so do
  // peers waiting on this rank.
  void Abort() override;

 private:
  GlooBackend(const BackendOptions& options,
              std::shared_ptr<AbortableGlooContext> context);

  // Queues a validated collective and returns its Work. `run` calls into
  // Gloo and throws Gloo's exceptions; empty for a collective with no
  // elements.
  std::shared_ptr<Work> Enqueue(const char* collective,
                                std::function<void(uint32_t tag)> run);

  // Runs `run` on the queue's thread, turning Gloo's exceptions into a
  // status; on failure closes every connection.
  absl::Status Run(const std::function<void(uint32_t tag)>& run,
                   uint64_t sequence, const std::string& where);

  // Gloo's per-operation timeout, from options().timeout.
  const std::chrono::milliseconds gloo_timeout_;
  // Connected for the backend's whole life; used only by the queue's thread
  // once the constructor has returned.
  const std::shared_ptr<AbortableGlooContext> context_;

  // Runs the collectives; its thread writes on Gloo's sockets, so it blocks
  // SIGPIPE. Declared last: started once every other member is ready.
  SerialOpQueue queue_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_GLOO_BACKEND_H_
