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
#include "server/malformed_request.h"

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
// The method is served raw (the generated WithRawMethod_<Method>): the call
// parses its request itself, so bytes that do not parse are answered
// INVALID_ARGUMENT naming the method and type (MalformedRequest()) without
// reaching the handler; gRPC would cancel such a call with INTERNAL.
//
// Lifetime: owned by gRPC's events; deletes itself once the handler has
// returned, the call is done and its answer (if any) was sent or refused.
// Thread-safe.
template <typename Request, typename Response>
class PendingCall final {
 public:
  // Asks gRPC for the next call of the method on a queue: the raw
  // Request<Method> of the service (context, request bytes, responder, cq,
  // cq, tag).
  using Requester = std::function<void(
      grpc::ServerContext*, grpc::ByteBuffer*,
      grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>*,
      grpc::ServerCompletionQueue*, grpc::ServerCompletionQueue*, void*)>;
  using Handler = std::function<void(PendingCall*)>;

  // What Serve() needs of a method: its name ("/package.Service/Method")
  // and how to request and handle its calls. Must outlive the queues'
  // Shutdown().
  struct Method {
    const char* name;
    Requester requester;
    Handler handler;
  };

  // Keeps a call of `method` waiting on every queue of `queues`.
  static void Serve(const CompletionQueues& queues, const Method* method) {
    for (const auto& queue : queues.queues()) Accept(queue.get(), method);
  }

  const grpc::ServerContext& context() const { return context_; }
  const Request& request() const { return request_; }

  // Sends the answer: `response` when `status` is OK. Exactly once.
  void Finish(const Response& response, const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      const bool started = queue_->StartOp([&] {
        if (status.ok()) {
          grpc::ByteBuffer bytes;
          bool own_buffer = false;
          grpc::Status serialized = grpc::SerializationTraits<Response>::Serialize(
              response, &bytes, &own_buffer);
          if (serialized.ok()) {
            responder_.Finish(bytes, status, &finished_tag_);
          } else {
            responder_.FinishWithError(serialized, &finished_tag_);
          }
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

  PendingCall(CompletionQueues::Queue* queue, const Method* method)
      : queue_(queue), method_(method), responder_(&context_) {
    context_.AsyncNotifyWhenDone(&done_tag_);
  }

  static void Accept(CompletionQueues::Queue* queue, const Method* method) {
    auto* call = new PendingCall(queue, method);
    grpc::ServerCompletionQueue* cq = queue->cq();
    if (!queue->StartOp([&] {
          method->requester(&call->context_, &call->request_bytes_,
                            &call->responder_, cq, cq, &call->accepted_tag_);
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
        Accept(queue_, method_);  // the next call
        // References: the done event's, and the handler's until Finish().
        {
          absl::MutexLock lock(&mu_);
          refs_ = 2;
        }
        if (grpc::SerializationTraits<Request>::Deserialize(&request_bytes_,
                                                            &request_)
                .ok()) {
          method_->handler(this);
        } else {
          Finish(Response(), MalformedRequest(method_->name));
        }
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
  const Method* const method_;
  grpc::ServerContext context_;
  grpc::ByteBuffer request_bytes_;  // emptied by parsing it into request_
  Request request_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_;
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
