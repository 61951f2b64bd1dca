// AbortableGlooContext: a Gloo rendezvous context whose collectives can be
// ended from another thread, whatever they are waiting on. Internal to the
// Gloo backend.
//
// Gloo alone cannot: tcp::Pair::signalException (Gloo's own reaction to a
// closed connection, and what GlooBackend::Abort() calls) wakes the
// operations a pair has queued, but not one whose payload is being read or
// written. A collective whose message was cut short (a peer that died, or
// whose reset was lost, after its message had partly arrived: seen over
// lossy links, reproduced by tests/worker/backend/gloo_cut_link_test) so
// waits for its full timeout even when the connection is known to be gone.
// This context hands Gloo's algorithms unbound buffers of its own that
// wrap the transport's: AbortWaits() wakes every wait on them, and every
// wait then, or later, throws gloo::IoException(kGlooAbortedMessage).
#ifndef GRADSYNC_WORKER_BACKEND_ABORTABLE_GLOO_CONTEXT_H_
#define GRADSYNC_WORKER_BACKEND_ABORTABLE_GLOO_CONTEXT_H_

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <memory>

namespace gradsync {

// The message of the exception a wait throws once the context is aborted.
inline constexpr char kGlooAbortedMessage[] = "the gloo backend was aborted";

// Thread-safety: AbortWaits() may be called from any thread at any time
// after ConnectFullMesh() returned, concurrently with collectives; the rest
// is Gloo's (one collective at a time). Lifetime: as gloo::Context; buffers
// it created must not outlive it (Gloo's algorithms destroy theirs before
// they return).
class AbortableGlooContext final : public gloo::rendezvous::Context {
 public:
  AbortableGlooContext(int rank, int size);
  ~AbortableGlooContext() override;

  // gloo::rendezvous::Context::connectFullMesh, then routes the unbound
  // buffers of every later collective through this context. Throws as
  // Gloo does.
  void ConnectFullMesh(gloo::rendezvous::Store& store,
                       std::shared_ptr<gloo::transport::Device>& device);

  // Wakes every wait of a collective in flight; from now on every wait
  // throws gloo::IoException(kGlooAbortedMessage). Idempotent.
  void AbortWaits();

 private:
  class Buffers;
  class TrackedBuffer;
  class TrackingTransport;

  const std::shared_ptr<Buffers> buffers_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_ABORTABLE_GLOO_CONTEXT_H_
