// A unary call served with gRPC's asynchronous API on CompletionQueues and
// answered later, from whichever thread completes it (a round closing).
#ifndef GRADSYNC_SERVER_PENDING_CALL_H_
#define GRADSYNC_SERVER_PENDING_CALL_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/completion_queues.h"

namespace gradsync {

// One call of a unary method whose answer may wait (see CompletionQueues
// for why such calls do not use the callback API).
//
// A method is served by Serve(): one call always waits for a client on each
// queue; when a client calls, the next one is requested and the method's
// handler runs, on the queue's thread, with the accepted call. The handler
// must lead to exactly one Finish(), from any thread, at any time: the call
// holds no thread while it waits. SetCancelHandler() says how to withdraw
// the work when the client goes away (cancels, or its deadline passes)
// first.
//
// Lifetime: owned by gRPC's events; deletes itself once the handler has
// returned, the call is done and its answer (if any) was sent or refused.
// Thread-safe.
template <typename Request, typename Response>
class PendingCall final {
 public:
  // Asks gRPC for the next call of the method on a queue: the generated
  // Request<Method> of the service (context, request, responder, cq, cq,
  // tag).
  using Requester = std::function<void(
      grpc::ServerContext*, Request*, grpc::ServerAsyncResponseWriter<Response>*,
      grpc::ServerCompletionQueue*, grpc::ServerCompletionQueue*, void*)>;
  using Handler = std::function<void(PendingCall*)>;

  // Keeps a call of the method waiting on every queue of `queues`. Both
  // functions must outlive the queues' Shutdown().
  static void Serve(const CompletionQueues& queues, const Requester* requester,
                    const Handler* handler) {
    for (const auto& queue : queues.queues()) {
      Accept(queue.get(), requester, handler);
    }
  }

  const grpc::ServerContext& context() const { return context_; }
  const Request& request() const { return request_; }

  // Sends the answer: `response` when `status` is OK. Exactly once.
  void Finish(const Response& response, const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      const bool started = queue_->StartOp([&] {
        if (status.ok()) {
          responder_.Finish(response, status, &finished_tag_);
        } else {
          responder_.FinishWithError(status, &finished_tag_);
        }
      });
      if (started) ++refs_;
    }
    Unref();  // the handler's promise to finish is kept
  }

  // Runs `cancel` when the client goes away before Finish(); at once when
  // it already did. `cancel` must lead to Finish().
  void SetCancelHandler(std::function<void()> cancel) {
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) {
        cancel_ = std::move(cancel);
        return;
      }
    }
    cancel();
  }

 private:
  enum class Event { kAccepted, kFinished, kDone };
  struct Tag final : CompletionQueues::Tag {
    Tag(PendingCall* call, Event event) : call(call), event(event) {}
    void Run(bool ok) override { call->On(event, ok); }
    PendingCall* const call;
    const Event event;
  };

  PendingCall(CompletionQueues::Queue* queue, const Requester* requester,
              const Handler* handler)
      : queue_(queue),
        requester_(requester),
        handler_(handler),
        responder_(&context_) {
    context_.AsyncNotifyWhenDone(&done_tag_);
  }

  static void Accept(CompletionQueues::Queue* queue, const Requester* requester,
                     const Handler* handler) {
    auto* call = new PendingCall(queue, requester, handler);
    grpc::ServerCompletionQueue* cq = queue->cq();
    if (!queue->StartOp([&] {
          (*requester)(&call->context_, &call->request_, &call->responder_,
                       cq, cq, &call->accepted_tag_);
        })) {
      delete call;  // the queue is closed: gRPC never saw it
    }
  }

  void On(Event event, bool ok) {
    switch (event) {
      case Event::kAccepted:
        if (!ok) {  // the server is shutting down: no call, no done event
          delete this;
          return;
        }
        Accept(queue_, requester_, handler_);  // the next call
        // References: the done event's, and the handler's until Finish().
        {
          absl::MutexLock lock(&mu_);
          refs_ = 2;
        }
        (*handler_)(this);
        return;
      case Event::kFinished:
        break;
      case Event::kDone: {
        std::function<void()> cancel;
        if (context_.IsCancelled()) {
          absl::MutexLock lock(&mu_);
          cancelled_ = true;
          cancel = std::move(cancel_);
          cancel_ = nullptr;
        }
        if (cancel) cancel();
        break;
      }
    }
    Unref();
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  CompletionQueues::Queue* const queue_;
  const Requester* const requester_;
  const Handler* const handler_;
  grpc::ServerContext context_;
  Request request_;
  grpc::ServerAsyncResponseWriter<Response> responder_;
  Tag accepted_tag_{this, Event::kAccepted};
  Tag finished_tag_{this, Event::kFinished};
  Tag done_tag_{this, Event::kDone};
  absl::Mutex mu_;
  // Events and promises still to come: the done event, the finish event
  // while an answer is on its way, the handler's Finish().
  int refs_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_PENDING_CALL_H_
