#include "server/monitor_service.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "common/grpc_status.h"

namespace gradsync {

// One worker's heartbeat stream: a state machine driven by the events of its
// completion queue, all on that queue's one thread (so it needs no lock).
// Reads one heartbeat at a time into the same message (its capacity is
// reused); answers only when HealthManager says so, one write at a time. A
// stream that ends by cancellation (the worker died or its connection broke)
// reports its member's stream broken. Deletes itself once every operation it
// started has completed and gRPC reported the call done.
class MonitorService::HeartbeatCall {
 public:
  // An event of this call on its queue.
  enum class Event { kAccepted, kRead, kWritten, kFinished, kDone };
  struct Tag final : CompletionQueues::Tag {
    Tag(HeartbeatCall* call, Event event) : call(call), event(event) {}
    void Run(bool ok) override { call->On(event, ok); }
    HeartbeatCall* const call;
    const Event event;
  };

  HeartbeatCall(MonitorService* service, CompletionQueues::Queue* queue)
      : service_(service),
        queue_(queue),
        stream_(&context_),
        session_(HealthManager::NewSession()) {
    context_.AsyncNotifyWhenDone(&done_tag_);
  }

  // Asks gRPC for the next stream on this call's queue; false when the
  // queue is closed (then the caller deletes the call: gRPC never saw it).
  bool Request() {
    grpc::ServerCompletionQueue* cq = queue_->cq();
    return queue_->StartOp([&] {
      service_->RequestHeartbeat(&context_, &stream_, cq, cq, &accepted_tag_);
    });
  }

  // Handles one event; `ok` is the queue's verdict on it.
  void On(Event event, bool ok) {
    switch (event) {
      case Event::kAccepted:
        if (!ok) {  // the server is shutting down: no call, no done event
          delete this;
          return;
        }
        service_->Accept(queue_);  // the next stream
        caller_ = service_->auth_->Identify(context_);
        Read();
        return;
      case Event::kRead:
        --pending_;
        if (ok) {
          OnHeartbeat();
        } else {  // the worker closed its side, or the stream broke
          FinishWith(grpc::Status::OK);
        }
        break;
      case Event::kWritten:
        --pending_;
        writing_ = false;
        if (ok && next_.has_value()) {
          Write(*std::move(next_));
          next_.reset();
        } else if (finish_.has_value()) {
          FinishWith(*finish_);
        }
        break;
      case Event::kFinished:
        --pending_;
        break;
      case Event::kDone:
        done_ = true;
        if (context_.IsCancelled()) {
          service_->health_->StreamBroken(session_.get());
        }
        break;
    }
    if (done_ && pending_ == 0) delete this;
  }

 private:
  // Each operation starts only while the queue is open (see the class
  // comment of CompletionQueues); one refused is simply not pending.
  void Read() {
    if (queue_->StartOp([&] { stream_.Read(&request_, &read_tag_); })) {
      ++pending_;
    }
  }

  void OnHeartbeat() {
    absl::Status allowed =
        caller_.ok() ? Authenticator::Authorize(*caller_,
                                                request_.member().job_id())
                     : caller_.status();
    if (!allowed.ok()) {
      FinishWith(ToGrpcStatus(allowed));
      return;
    }
    v1::HeartbeatResponse response;
    absl::StatusOr<bool> answer =
        service_->health_->Heartbeat(session_.get(), &request_, &response);
    if (!answer.ok()) {
      FinishWith(ToGrpcStatus(answer.status()));
      return;
    }
    if (*answer) {
      if (writing_) {
        next_ = std::move(response);  // only the latest state matters
      } else {
        Write(std::move(response));
      }
    }
    Read();
  }

  void Write(v1::HeartbeatResponse response) {
    outgoing_ = std::move(response);
    if (queue_->StartOp([&] { stream_.Write(outgoing_, &written_tag_); })) {
      writing_ = true;
      ++pending_;
    }
  }

  // Finishes now, or once the write in flight completes.
  void FinishWith(grpc::Status status) {
    if (finishing_) return;
    if (writing_) {
      finish_ = std::move(status);
      next_.reset();
      return;
    }
    finishing_ = true;
    if (queue_->StartOp([&] { stream_.Finish(status, &finished_tag_); })) {
      ++pending_;
    }
  }

  MonitorService* const service_;
  CompletionQueues::Queue* const queue_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<v1::HeartbeatResponse, v1::HeartbeatRequest>
      stream_;
  const std::unique_ptr<HealthManager::Session> session_;
  // Who opened the stream (from its metadata, when it was accepted).
  absl::StatusOr<Caller> caller_ = absl::UnauthenticatedError("not accepted");
  v1::HeartbeatRequest request_;
  v1::HeartbeatResponse outgoing_;
  std::optional<v1::HeartbeatResponse> next_;
  std::optional<grpc::Status> finish_;
  bool writing_ = false;
  bool finishing_ = false;
  bool done_ = false;
  int pending_ = 0;  // reads, writes and the finish in flight
  Tag accepted_tag_{this, Event::kAccepted};
  Tag read_tag_{this, Event::kRead};
  Tag written_tag_{this, Event::kWritten};
  Tag finished_tag_{this, Event::kFinished};
  Tag done_tag_{this, Event::kDone};
};

void MonitorService::Start(CompletionQueues* queues) {
  for (const auto& queue : queues->queues()) Accept(queue.get());
}

void MonitorService::Accept(CompletionQueues::Queue* queue) {
  auto call = std::make_unique<HeartbeatCall>(this, queue);
  if (call->Request()) call.release();  // it deletes itself when done
}

grpc::ServerUnaryReactor* MonitorService::ReportCompletion(
    grpc::CallbackServerContext* context,
    const v1::ReportCompletionRequest* request,
    v1::ReportCompletionResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->member().job_id())) {
    return refused;
  }
  absl::StatusOr<v1::JobState> state = health_->ReportCompletion(*request);
  if (state.ok()) response->set_job_state(*state);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(state.status()));
  return reactor;
}

}  // namespace gradsync
