#include "server/monitor_service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// What a heartbeat stream does with its messages; the stream's state
// machine (StreamCall) is the same for both protocols.
//
// A protocol: OnMessage() handles one request and may fill an answer;
// a non-OK status ends the stream with it. Merge() folds a newer answer
// into one waiting behind a write in flight. OnBroken() runs when the
// stream ended by cancellation (the worker died or its connection broke).

// Monitor.Heartbeat: one member per stream.
class MemberProtocol {
 public:
  using Request = v1::HeartbeatRequest;
  using Response = v1::HeartbeatResponse;

  explicit MemberProtocol(HealthManager* health)
      : health_(health), session_(HealthManager::NewSession()) {}

  absl::Status OnMessage(const Caller& caller, Request* request,
                         std::optional<Response>* answer) {
    GS_RETURN_IF_ERROR(
        Authenticator::Authorize(caller, request->member().job_id()));
    Response response;
    GS_ASSIGN_OR_RETURN(bool tell,
                        health_->Heartbeat(session_.get(), request, &response));
    if (tell) *answer = std::move(response);
    return absl::OkStatus();
  }
  // Only the latest state matters.
  static void Merge(Response* waiting, Response newer) {
    *waiting = std::move(newer);
  }
  void OnBroken() { health_->StreamBroken(session_.get()); }

 private:
  HealthManager* const health_;
  const std::unique_ptr<HealthManager::Session> session_;
};

// Monitor.NodeHeartbeat: the members of one node, each with the session
// its own stream would have, keyed by job and rank.
class NodeProtocol {
 public:
  using Request = v1::NodeHeartbeatRequest;
  using Response = v1::NodeHeartbeatResponse;

  explicit NodeProtocol(HealthManager* health) : health_(health) {}

  absl::Status OnMessage(const Caller& caller, Request* request,
                         std::optional<Response>* answer) {
    for (const v1::MemberRef& member : request->closed()) {
      sessions_.erase(Key(member));
    }
    Response response;
    for (v1::HeartbeatRequest& heartbeat : *request->mutable_heartbeats()) {
      OnHeartbeat(caller, &heartbeat, &response);
    }
    if (response.answers_size() > 0) *answer = std::move(response);
    return absl::OkStatus();
  }
  // Every member's answer counts: the newer ones are appended.
  static void Merge(Response* waiting, Response newer) {
    for (v1::MemberHeartbeatResponse& a : *newer.mutable_answers()) {
      *waiting->add_answers() = std::move(a);
    }
  }
  void OnBroken() {
    for (auto& [key, session] : sessions_) health_->StreamBroken(session.get());
  }

 private:
  using SessionKey = std::pair<std::string, int>;  // job id, rank
  static SessionKey Key(const v1::MemberRef& m) {
    return {m.job_id(), m.rank()};
  }

  void OnHeartbeat(const Caller& caller, v1::HeartbeatRequest* heartbeat,
                   Response* response) {
    const v1::MemberRef member = heartbeat->member();
    absl::Status allowed = Authenticator::Authorize(caller, member.job_id());
    std::unique_ptr<HealthManager::Session>& session = sessions_[Key(member)];
    if (session == nullptr) session = HealthManager::NewSession();
    v1::HeartbeatResponse answer;
    absl::StatusOr<bool> tell =
        allowed.ok() ? health_->Heartbeat(session.get(), heartbeat, &answer)
                     : absl::StatusOr<bool>(allowed);
    if (tell.ok() && !*tell) return;
    v1::MemberHeartbeatResponse* out = response->add_answers();
    *out->mutable_member() = member;
    if (tell.ok()) {
      *out->mutable_response() = std::move(answer);
      return;
    }
    // The member's own stream would end here: its place on this one does.
    out->set_error_code(static_cast<int>(tell.status().code()));
    out->set_error_message(std::string(tell.status().message()));
    sessions_.erase(Key(member));
  }

  HealthManager* const health_;
  absl::flat_hash_map<SessionKey, std::unique_ptr<HealthManager::Session>>
      sessions_;
};

}  // namespace

// One heartbeat stream: a state machine driven by the events of its
// completion queue, all on that queue's one thread (so it needs no lock).
// Reads one message at a time into the same request (its capacity is
// reused); answers only when the protocol says so, one write at a time. A
// stream that ends by cancellation tells the protocol. Deletes itself once
// every operation it started has completed and gRPC reported the call done.
template <typename Protocol>
class MonitorService::StreamCall {
 public:
  using Request = typename Protocol::Request;
  using Response = typename Protocol::Response;
  using Requester = void (MonitorService::*)(
      grpc::ServerContext*,
      grpc::ServerAsyncReaderWriter<Response, Request>*,
      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);

  // An event of this call on its queue.
  enum class Event { kAccepted, kRead, kWritten, kFinished, kDone };
  struct Tag final : CompletionQueues::Tag {
    Tag(StreamCall* call, Event event) : call(call), event(event) {}
    void Run(bool ok) override { call->On(event, ok); }
    StreamCall* const call;
    const Event event;
  };

  StreamCall(MonitorService* service, Requester requester,
             CompletionQueues::Queue* queue)
      : service_(service),
        requester_(requester),
        queue_(queue),
        stream_(&context_),
        protocol_(service->health_) {
    context_.AsyncNotifyWhenDone(&done_tag_);
  }

  // Keeps a stream waiting for a client on `queue`.
  static void Accept(MonitorService* service, Requester requester,
                     CompletionQueues::Queue* queue) {
    auto call = std::make_unique<StreamCall>(service, requester, queue);
    if (call->Listen()) call.release();  // it deletes itself when done
  }

  // Asks gRPC for the next stream on this call's queue; false when the
  // queue is closed (then the caller deletes the call: gRPC never saw it).
  bool Listen() {
    grpc::ServerCompletionQueue* cq = queue_->cq();
    return queue_->StartOp([&] {
      (service_->*requester_)(&context_, &stream_, cq, cq, &accepted_tag_);
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
        Accept(service_, requester_, queue_);  // the next stream
        caller_ = service_->auth_->Identify(context_);
        if (absl::StatusOr<ConnectionLimits::Lease> lease =
                service_->limits_->Acquire(context_.peer());
            lease.ok()) {
          lease_ = *std::move(lease);
          Read();
        } else {
          FinishWith(ToGrpcStatus(lease.status()));
        }
        return;
      case Event::kRead:
        --pending_;
        if (ok) {
          OnMessage();
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
        if (context_.IsCancelled()) protocol_.OnBroken();
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

  void OnMessage() {
    std::optional<Response> answer;
    absl::Status handled =
        caller_.ok() ? protocol_.OnMessage(*caller_, &request_, &answer)
                     : caller_.status();
    if (!handled.ok()) {
      FinishWith(ToGrpcStatus(handled));
      return;
    }
    if (answer.has_value()) {
      if (!writing_) {
        Write(*std::move(answer));
      } else if (next_.has_value()) {
        Protocol::Merge(&*next_, *std::move(answer));
      } else {
        next_ = std::move(answer);
      }
    }
    Read();
  }

  void Write(Response response) {
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
  const Requester requester_;
  CompletionQueues::Queue* const queue_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<Response, Request> stream_;
  Protocol protocol_;
  // Who opened the stream (from its metadata, when it was accepted).
  absl::StatusOr<Caller> caller_ = absl::UnauthenticatedError("not accepted");
  // Its place among its connection's streams.
  ConnectionLimits::Lease lease_;
  Request request_;
  Response outgoing_;
  std::optional<Response> next_;
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
  for (const auto& queue : queues->queues()) {
    StreamCall<MemberProtocol>::Accept(
        this, &MonitorService::RequestHeartbeat, queue.get());
    StreamCall<NodeProtocol>::Accept(
        this, &MonitorService::RequestNodeHeartbeat, queue.get());
  }
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
