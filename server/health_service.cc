#include "server/health_service.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/heartbeat_policer.h"
#include "server/malformed_request.h"

namespace gradsync {
namespace {

// What a heartbeat stream does with its messages; the stream's state
// machine (StreamCall) is the same for both protocols.
//
// A protocol: OnMessage() handles one request and may fill an answer;
// a non-OK status ends the stream with it. Merge() folds a newer answer
// into one waiting behind a write in flight. OnBroken() runs when the
// stream ended by cancellation (the worker died or its connection broke).
// asked() is what the answers so far asked of the stream's members (for
// its HeartbeatPolicer); Describe() names them in a log line.

// The heartbeats a second an answer asks for (0 when it names no interval).
double AskedRate(const v1::HeartbeatResponse& answer) {
  const absl::Duration interval =
      FromProtoDuration(answer.heartbeat_interval());
  return interval > absl::ZeroDuration()
             ? absl::FDivDuration(absl::Seconds(1), interval)
             : 0.0;
}

// The line of turns under a cap (HeartbeatPacer) a heartbeat of `job_id`
// takes its turn in: its job's, or, when `caller` may not report for that
// job, one line all such heartbeats share (they are refused once handled),
// so that they take no turn of the job they name. No job's id is empty.
absl::string_view LineOf(const absl::StatusOr<Caller>& caller,
                         const std::string& job_id) {
  return caller.ok() && Authenticator::Authorize(*caller, job_id).ok()
             ? absl::string_view(job_id)
             : absl::string_view();
}

// Monitor.Heartbeat: one member per stream.
class MemberProtocol {
 public:
  using Request = v1::HeartbeatRequest;
  using Response = v1::HeartbeatResponse;
  static constexpr const char* kMethod = "/gradsync.v1.Monitor/Heartbeat";
  // Heartbeats in one message.
  static int Heartbeats(const Request&) { return 1; }
  // When a message of `caller` read at `now` may be handled under a cap.
  static absl::Time Turn(HeartbeatPacer* pacer,
                         const absl::StatusOr<Caller>& caller,
                         const Request& r, absl::Time now) {
    return pacer->Turn(LineOf(caller, r.member().job_id()), 1, now);
  }

  // `queue`: the completion queue serving the stream (its index).
  MemberProtocol(HealthManager* health, int queue)
      : health_(health), session_(HealthManager::NewSession(queue)) {}

  absl::Status OnMessage(const Caller& caller, Request* request,
                         std::optional<Response>* answer) {
    GS_RETURN_IF_ERROR(
        Authenticator::Authorize(caller, request->member().job_id()));
    Response response;
    member_ = request->member();
    GS_ASSIGN_OR_RETURN(bool tell,
                        health_->Heartbeat(session_.get(), request, &response));
    if (tell) {
      if (const double rate = AskedRate(response); rate > 0) asked_rate_ = rate;
      *answer = std::move(response);
    }
    return absl::OkStatus();
  }
  HeartbeatPolicer::Asked asked() const {
    HeartbeatPolicer::Asked asked;
    asked.rate = asked_rate_;
    asked.members = asked_rate_ > 0 ? 1 : 0;
    return asked;
  }
  std::string Describe() const {
    return absl::StrCat("rank ", member_.rank(), " of job '",
                        member_.job_id(), "'");
  }
  // Only the latest state matters.
  static void Merge(Response* waiting, Response newer) {
    *waiting = std::move(newer);
  }
  void OnBroken() { health_->StreamBroken(session_.get()); }

 private:
  HealthManager* const health_;
  const std::unique_ptr<HealthManager::Session> session_;
  v1::MemberRef member_;  // the last heartbeat's
  double asked_rate_ = 0;  // heartbeats a second; 0 until told
};

// Monitor.NodeHeartbeat: the members of one node, each with the session
// its own stream would have, keyed by job and rank.
class NodeProtocol {
 public:
  using Request = v1::NodeHeartbeatRequest;
  using Response = v1::NodeHeartbeatResponse;
  static constexpr const char* kMethod = "/gradsync.v1.Monitor/NodeHeartbeat";
  static int Heartbeats(const Request& r) { return r.heartbeats_size(); }
  // Each job's heartbeats (runs of one job, in order: a node's members are
  // mostly of one job) take their turns in its line; the message is
  // handled at the latest.
  static absl::Time Turn(HeartbeatPacer* pacer,
                         const absl::StatusOr<Caller>& caller,
                         const Request& r, absl::Time now) {
    absl::Time turn = now;
    for (int i = 0, end = 0; i < r.heartbeats_size(); i = end) {
      const std::string& job = r.heartbeats(i).member().job_id();
      for (end = i + 1; end < r.heartbeats_size() &&
                        r.heartbeats(end).member().job_id() == job;
           ++end) {
      }
      turn = std::max(turn, pacer->Turn(LineOf(caller, job), end - i, now));
    }
    return turn;
  }

  NodeProtocol(HealthManager* health, int queue)
      : health_(health), queue_(queue) {}

  absl::Status OnMessage(const Caller& caller, Request* request,
                         std::optional<Response>* answer) {
    for (const v1::MemberRef& member : request->closed()) {
      sessions_.erase(Key(member));
      asked_.erase(Key(member));
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
  HeartbeatPolicer::Asked asked() const {
    HeartbeatPolicer::Asked asked;
    for (const auto& [key, rate] : asked_) asked.rate += rate;
    asked.members = static_cast<int>(asked_.size());
    return asked;
  }
  std::string Describe() const {
    return asked_.empty() ? std::string("a node's stream")
                          : absl::StrCat("a node's stream (", asked_.size(),
                                         " members, job '",
                                         asked_.begin()->first.first, "', ...)");
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
    if (session == nullptr) session = HealthManager::NewSession(queue_);
    v1::HeartbeatResponse answer;
    absl::StatusOr<bool> tell =
        allowed.ok() ? health_->Heartbeat(session.get(), heartbeat, &answer)
                     : absl::StatusOr<bool>(allowed);
    if (tell.ok() && !*tell) return;
    v1::MemberHeartbeatResponse* out = response->add_answers();
    *out->mutable_member() = member;
    if (tell.ok()) {
      if (const double rate = AskedRate(answer); rate > 0) {
        asked_[Key(member)] = rate;
      }
      *out->mutable_response() = std::move(answer);
      return;
    }
    // The member's own stream would end here: its place on this one does.
    out->set_error_code(static_cast<int>(tell.status().code()));
    out->set_error_message(std::string(tell.status().message()));
    sessions_.erase(Key(member));
    asked_.erase(Key(member));
  }

  HealthManager* const health_;
  const int queue_;
  absl::flat_hash_map<SessionKey, std::unique_ptr<HealthManager::Session>>
      sessions_;
  // The heartbeats a second last asked of each member told an interval.
  absl::flat_hash_map<SessionKey, double> asked_;
};

}  // namespace

HealthService::HealthService(HealthManager* health, const Authenticator* auth,
                             ConnectionLimits* limits,
                             double max_heartbeat_rate, bool police)
    : health_(health),
      auth_(auth),
      limits_(limits),
      pacer_(max_heartbeat_rate > 0
                 ? std::make_unique<HeartbeatPacer>(max_heartbeat_rate)
                 : nullptr),
      police_(police),
      completions_(health) {}

HealthService::~HealthService() = default;

void HealthService::NoteHeld(const std::string& who,
                             const HeartbeatPolicer::Asked& asked) {
  const absl::Time now = absl::Now();
  int64_t streams = 0;
  {
    absl::MutexLock lock(&held_mu_);
    ++held_streams_;
    if (now - held_logged_ < absl::Minutes(1)) return;
    held_logged_ = now;
    streams = held_streams_;
    held_streams_ = 0;
  }
  GS_LOG(WARNING) << streams
                  << " heartbeat stream(s) sent faster than the coordinator "
                     "asked (the latest: "
                  << who << ", asked for "
                  << absl::StrFormat("%.3g", asked.rate)
                  << " heartbeats/s): their messages are read at most "
                  << HeartbeatPolicer::kTolerance
                  << "x that fast, the rest wait in the network's buffers "
                     "(are those workers told the interval they were "
                     "asked for?)";
}

HeartbeatPacer::Waits HealthService::TurnWaits(absl::Time now) const {
  return pacer_ != nullptr ? pacer_->WaitsAt(now) : HeartbeatPacer::Waits();
}

// One heartbeat stream: a state machine driven by the events of its
// completion queue, all on that queue's one thread (so it needs no lock).
// Reads one message at a time into the same request (its capacity is
// reused); answers only when the protocol says so, one write at a time. A
// stream that ends by cancellation tells the protocol. Deletes itself once
// every operation it started has completed and gRPC reported the call done.
template <typename Protocol>
class HealthService::StreamCall {
 public:
  using Request = typename Protocol::Request;
  using Response = typename Protocol::Response;
  // The raw method's (the stream parses its messages itself, so bytes that
  // do not parse end it with MalformedRequest()).
  using Requester = void (HealthService::*)(
      grpc::ServerContext*,
      grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>*,
      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);

  // An event of this call on its queue.
  enum class Event { kAccepted, kRead, kHeld, kWritten, kFinished, kDone };
  struct Tag final : CompletionQueues::Tag {
    Tag(StreamCall* call, Event event) : call(call), event(event) {}
    void Run(bool ok) override { call->On(event, ok); }
    StreamCall* const call;
    const Event event;
  };

  StreamCall(HealthService* service, Requester requester,
             CompletionQueues::Queue* queue)
      : service_(service),
        requester_(requester),
        queue_(queue),
        stream_(&context_),
        protocol_(service->health_, queue->index()) {
    context_.AsyncNotifyWhenDone(&done_tag_);
  }

  // Keeps a stream waiting for a client on `queue`.
  static void Accept(HealthService* service, Requester requester,
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
        if (!ok) {  // the worker closed its side, or the stream broke
          FinishWith(grpc::Status::OK);
        } else if (grpc::SerializationTraits<Request>::Deserialize(
                       &request_bytes_, &request_)
                       .ok()) {
          OnRead();
        } else {
          FinishWith(MalformedRequest(Protocol::kMethod));
        }
        break;
      case Event::kHeld:
        --pending_;
        held_ = false;
        if (!ok) {  // cancelled: the stream is done
          FinishWith(grpc::Status::OK);
        } else if (policed_) {
          policed_ = false;
          Pace();
        } else {
          OnMessage();
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
        if (held_) hold_.Cancel();  // a message held back goes
        break;
    }
    if (done_ && pending_ == 0) delete this;
  }

 private:
  // Each operation starts only while the queue is open (see the class
  // comment of CompletionQueues); one refused is simply not pending.
  void Read() {
    if (queue_->StartOp([&] { stream_.Read(&request_bytes_, &read_tag_); })) {
      ++pending_;
    }
  }

  // A message was read: handled now, or later when its stream sends
  // faster than asked (HeartbeatPolicer), then at its turn under a cap.
  void OnRead() {
    const absl::Time now = absl::Now();
    const HeartbeatPolicer::Asked asked = protocol_.asked();
    const absl::Time admitted =
        service_->police_
            ? policer_.Admit(Protocol::Heartbeats(request_), asked, now)
            : now;
    if (admitted > now) {
      if (policer_.held() == 1) service_->NoteHeld(protocol_.Describe(), asked);
      if (HoldUntil(admitted)) {
        policed_ = true;
        return;
      }
    }
    Pace();
  }

  void Pace() {
    if (service_->pacer_ != nullptr &&
        HoldUntil(Protocol::Turn(service_->pacer_.get(), caller_, request_,
                                 absl::Now()))) {
      return;
    }
    OnMessage();
  }

  // Sets the alarm that holds the message read until `until`; false when
  // that is past or the queue is closing (then it is handled now).
  bool HoldUntil(absl::Time until) {
    if (until <= absl::Now()) return false;
    grpc::ServerCompletionQueue* cq = queue_->cq();
    if (!queue_->StartOp(
            [&] { hold_.Set(cq, absl::ToChronoTime(until), &held_tag_); })) {
      return false;
    }
    ++pending_;
    held_ = true;
    return true;
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

  void Write(const Response& response) {
    outgoing_.Clear();  // the last write's bytes (its write completed)
    bool own_buffer = false;
    grpc::Status serialized = grpc::SerializationTraits<Response>::Serialize(
        response, &outgoing_, &own_buffer);
    if (!serialized.ok()) {
      FinishWith(serialized);
      return;
    }
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

  HealthService* const service_;
  const Requester requester_;
  CompletionQueues::Queue* const queue_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  Protocol protocol_;
  // Who opened the stream (from its metadata, when it was accepted).
  absl::StatusOr<Caller> caller_ = absl::UnauthenticatedError("not accepted");
  // Its place among its connection's streams.
  ConnectionLimits::Lease lease_;
  grpc::ByteBuffer request_bytes_;  // emptied by parsing it into request_
  Request request_;
  grpc::ByteBuffer outgoing_;  // the response in flight, serialized
  std::optional<Response> next_;
  std::optional<grpc::Status> finish_;
  bool writing_ = false;
  bool finishing_ = false;
  bool done_ = false;
  bool held_ = false;  // hold_ is set
  bool policed_ = false;  // by policer_ (then the cap's turn is next)
  int pending_ = 0;  // reads, holds, writes and the finish in flight
  Tag accepted_tag_{this, Event::kAccepted};
  Tag read_tag_{this, Event::kRead};
  Tag held_tag_{this, Event::kHeld};
  // Holds a message back (policer_), or until its turn under a cap (an
  // alarm: the queue threads must not sleep instead, with Debian's gRPC
  // they are the ones that poll the network).
  grpc::Alarm hold_;
  HeartbeatPolicer policer_;
  Tag written_tag_{this, Event::kWritten};
  Tag finished_tag_{this, Event::kFinished};
  Tag done_tag_{this, Event::kDone};
};

void HealthService::Start(CompletionQueues* queues) {
  for (const auto& queue : queues->queues()) {
    StreamCall<MemberProtocol>::Accept(
        this, &HealthService::RequestHeartbeat, queue.get());
    StreamCall<NodeProtocol>::Accept(
        this, &HealthService::RequestNodeHeartbeat, queue.get());
  }
}

grpc::ServerUnaryReactor* HealthService::ReportCompletion(
    grpc::CallbackServerContext* context,
    const v1::ReportCompletionRequest* request,
    v1::ReportCompletionResponse* response) {
  if (auto* refused = auth_->Refuse(context, request->member().job_id())) {
    return refused;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  completions_.Report(*request, [reactor, response](
                                    absl::StatusOr<v1::JobState> state) {
    if (state.ok()) response->set_job_state(*state);
    reactor->Finish(ToGrpcStatus(state.status()));
  });
  return reactor;
}

}  // namespace gradsync
