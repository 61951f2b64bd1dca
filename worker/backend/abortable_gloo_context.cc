#include "worker/backend/abortable_gloo_context.h"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

// The unbound buffers alive in a context, and whether it was aborted.
// Thread-safe.
class AbortableGlooContext::Buffers {
 public:
  void Add(gloo::transport::UnboundBuffer* buffer) {
    absl::MutexLock lock(&mu_);
    live_.insert(buffer);
  }
  void Remove(gloo::transport::UnboundBuffer* buffer) {
    absl::MutexLock lock(&mu_);
    live_.erase(buffer);
  }

  // Marks the context aborted, then wakes the waits of every live buffer.
  // A wait that starts after the mark throws before it waits; one that
  // started before it is woken (Gloo's abortWait* also ends a wait that
  // starts just after it, so none slips between the two).
  void AbortAll() {
    absl::MutexLock lock(&mu_);
    aborted_.store(true);
    for (gloo::transport::UnboundBuffer* buffer : live_) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }

  void ThrowIfAborted() const {
    if (aborted_.load()) throw gloo::IoException(kGlooAbortedMessage);
  }

 private:
  absl::Mutex mu_;
  // The transport's buffers (the ones TrackedBuffer wraps).
  absl::flat_hash_set<gloo::transport::UnboundBuffer*> live_
      ABSL_GUARDED_BY(mu_);
  std::atomic<bool> aborted_{false};
};

// A transport buffer, registered in Buffers for its life; its waits throw
// once the context is aborted, instead of returning false as Gloo's
// aborted waits do (Gloo's algorithms ignore that and go on).
class AbortableGlooContext::TrackedBuffer final
    : public gloo::transport::UnboundBuffer {
 public:
  TrackedBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> inner,
                std::shared_ptr<Buffers> buffers)
      : gloo::transport::UnboundBuffer(inner->ptr, inner->size),
        inner_(std::move(inner)),
        buffers_(std::move(buffers)) {
    buffers_->Add(inner_.get());
  }
  ~TrackedBuffer() override { buffers_->Remove(inner_.get()); }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    buffers_->ThrowIfAborted();
    const bool done = inner_->waitRecv(rank, timeout);
    buffers_->ThrowIfAborted();
    return done;
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    buffers_->ThrowIfAborted();
    const bool done = inner_->waitSend(rank, timeout);
    buffers_->ThrowIfAborted();
    return done;
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }

  void send(int dst_rank, uint64_t slot, size_t offset,
            size_t nbytes) override {
    buffers_->ThrowIfAborted();
    inner_->send(dst_rank, slot, offset, nbytes);
  }
  void recv(int src_rank, uint64_t slot, size_t offset,
            size_t nbytes) override {
    buffers_->ThrowIfAborted();
    inner_->recv(src_rank, slot, offset, nbytes);
  }
  void recv(std::vector<int> src_ranks, uint64_t slot, size_t offset,
            size_t nbytes) override {
    buffers_->ThrowIfAborted();
    inner_->recv(std::move(src_ranks), slot, offset, nbytes);
  }

 private:
  const std::unique_ptr<gloo::transport::UnboundBuffer> inner_;
  const std::shared_ptr<Buffers> buffers_;
};

// The connected transport context, with every unbound buffer it creates
// wrapped in a TrackedBuffer. Pairs are the transport's own.
class AbortableGlooContext::TrackingTransport final
    : public gloo::transport::Context {
 public:
  TrackingTransport(std::shared_ptr<gloo::transport::Context> inner,
                    std::shared_ptr<Buffers> buffers)
      : gloo::transport::Context(inner->rank, inner->size),
        inner_(std::move(inner)),
        buffers_(std::move(buffers)) {
    setTimeout(inner_->getTimeout());
  }

  std::unique_ptr<gloo::transport::Pair>& getPair(int rank) override {
    return inner_->getPair(rank);
  }
  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override {
    return inner_->createPair(rank);
  }
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(
      void* ptr, size_t size) override {
    return std::make_unique<TrackedBuffer>(
        inner_->createUnboundBuffer(ptr, size), buffers_);
  }

 private:
  const std::shared_ptr<gloo::transport::Context> inner_;
  const std::shared_ptr<Buffers> buffers_;
};

AbortableGlooContext::AbortableGlooContext(int rank, int size)
    : gloo::rendezvous::Context(rank, size),
      buffers_(std::make_shared<Buffers>()) {}

AbortableGlooContext::~AbortableGlooContext() = default;

void AbortableGlooContext::ConnectFullMesh(
    gloo::rendezvous::Store& store,
    std::shared_ptr<gloo::transport::Device>& device) {
  connectFullMesh(store, device);
  transportContext_ =
      std::make_shared<TrackingTransport>(transportContext_, buffers_);
}

void AbortableGlooContext::AbortWaits() { buffers_->AbortAll(); }

}  // namespace gradsync
