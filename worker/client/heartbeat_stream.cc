// GrpcCoordinatorClient's heartbeat streams (Monitor.Heartbeat and
// Monitor.NodeHeartbeat) over gRPC's callback API: the reactor behind
// HeartbeatStream and NodeHeartbeatStream (see grpc_coordinator_client.h).
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

// A member's heartbeat waiting behind one in flight: only the newest counts.
void Merge(v1::HeartbeatRequest* waiting, v1::HeartbeatRequest newer) {
  *waiting = std::move(newer);
}

// A node's batch waiting behind one in flight: a member's newer heartbeat
// replaces its older one; other members' heartbeats and closed members are
// kept.
void Merge(v1::NodeHeartbeatRequest* waiting, v1::NodeHeartbeatRequest newer) {
  for (v1::HeartbeatRequest& heartbeat : *newer.mutable_heartbeats()) {
    auto same = std::find_if(
        waiting->mutable_heartbeats()->begin(),
        waiting->mutable_heartbeats()->end(),
        [&](const v1::HeartbeatRequest& old) {
          return old.member().job_id() == heartbeat.member().job_id() &&
                 old.member().rank() == heartbeat.member().rank();
        });
    if (same != waiting->mutable_heartbeats()->end()) {
      *same = std::move(heartbeat);
    } else {
      *waiting->add_heartbeats() = std::move(heartbeat);
    }
  }
  for (v1::MemberRef& closed : *newer.mutable_closed()) {
    *waiting->add_closed() = std::move(closed);
  }
}

// A heartbeat stream (OutgoingStream) over the callback API: one read always
// pending (answers), at most one write in flight and one waiting, which a
// newer message is merged into (Merge()).
//
// Send() and Close() start operations from outside gRPC's reactions, which
// is only allowed while the call cannot complete: gRPC destroys its stream
// object before OnDone, so a write started in that gap would run on freed
// memory. The reactor therefore holds the call open (AddHold) until its
// pending read fails, which happens first whenever the call ends (finished
// by the coordinator, broken, or cancelled), and starts nothing after that.
template <typename Request, typename Response>
class StreamReactor final : public OutgoingStream<Request>,
                            public grpc::ClientBidiReactor<Request, Response> {
 public:
  using Reactor = grpc::ClientBidiReactor<Request, Response>;
  // Starts the call on `context` with the reactor (stub->async()->Method).
  using Starter = std::function<void(grpc::ClientContext*, Reactor*)>;

  // `on_done` sees the final status and the context (trailing metadata)
  // before the stream counts as ended.
  StreamReactor(
      const Starter& start, const std::string& authorization,
      std::function<void(const Response&)> on_response,
      std::function<void(const grpc::ClientContext&, const grpc::Status&)>
          on_done)
      : on_response_(std::move(on_response)), on_done_(std::move(on_done)) {
    if (!authorization.empty()) {
      context_.AddMetadata("authorization", authorization);
    }
    start(&context_, this);
    Reactor::AddHold();
    Reactor::StartRead(&response_);
    Reactor::StartCall();
  }

  ~StreamReactor() override {
    absl::MutexLock lock(&mu_);
    if (!done_.has_value()) context_.TryCancel();
    mu_.Await(absl::Condition(
        +[](std::optional<absl::Status>* done) { return done->has_value(); },
        &done_));
  }

  bool Send(Request request) override {
    absl::MutexLock lock(&mu_);
    if (ending_ || closing_) return false;
    if (writing_) {
      if (next_.has_value()) {
        Merge(&*next_, std::move(request));
      } else {
        next_ = std::move(request);
      }
      return true;
    }
    writing_ = true;
    outgoing_ = std::move(request);
    Reactor::StartWrite(&outgoing_);
    return true;
  }

  std::optional<absl::Status> ended() const override {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  absl::Status Close(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    if (!closing_ && !ending_) {
      closing_ = true;
      next_.reset();
      if (!writing_) Reactor::StartWritesDone();
    }
    auto finished = [](std::optional<absl::Status>* done) {
      return done->has_value();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(+finished, &done_), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the coordinator did not end the heartbeat stream within ",
          absl::FormatDuration(timeout)));
    }
    return *done_;
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The call is ending: no operation may start any more; then let it
      // complete (OnDone follows).
      {
        absl::MutexLock lock(&mu_);
        ending_ = true;
      }
      Reactor::RemoveHold();
      return;
    }
    on_response_(response_);
    Reactor::StartRead(&response_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok || ending_) return;
    if (next_.has_value()) {
      writing_ = true;
      outgoing_ = std::move(*next_);
      next_.reset();
      Reactor::StartWrite(&outgoing_);
    } else if (closing_) {
      Reactor::StartWritesDone();
    }
  }

  void OnDone(const grpc::Status& status) override {
    on_done_(context_, status);
    absl::MutexLock lock(&mu_);
    done_ = FromGrpcStatus(status);
  }

 private:
  const std::function<void(const Response&)> on_response_;
  const std::function<void(const grpc::ClientContext&, const grpc::Status&)>
      on_done_;
  grpc::ClientContext context_;
  Response response_;  // used by OnReadDone only

  mutable absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // The read failed: the call is ending and starts no more operations.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  Request outgoing_ ABSL_GUARDED_BY(mu_);
  std::optional<Request> next_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

template <typename Request, typename Response>
std::unique_ptr<OutgoingStream<Request>> GrpcCoordinatorClient::OpenStream(
    void (v1::Monitor::Stub::async::*method)(
        grpc::ClientContext*, grpc::ClientBidiReactor<Request, Response>*),
    std::function<void(const Response&)> on_response) {
  // The reactor keeps the route (its stub) alive until the stream ends.
  std::shared_ptr<const Route> route = this->route();
  auto* calls = route->monitor->async();
  return std::make_unique<StreamReactor<Request, Response>>(
      [calls, method](grpc::ClientContext* context,
                      grpc::ClientBidiReactor<Request, Response>* reactor) {
        (calls->*method)(context, reactor);
      },
      authorization_, std::move(on_response),
      [this, route = std::move(route)](const grpc::ClientContext& context,
                                       const grpc::Status& status) {
        if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
          Reroute(context, status, *route);
        }
      });
}

std::unique_ptr<HeartbeatStream> GrpcCoordinatorClient::OpenHeartbeatStream(
    std::function<void(const v1::HeartbeatResponse&)> on_response) {
  return OpenStream(&v1::Monitor::Stub::async::Heartbeat,
                    std::move(on_response));
}

std::unique_ptr<NodeHeartbeatStream> GrpcCoordinatorClient::OpenNodeHeartbeatStream(
    std::function<void(const v1::NodeHeartbeatResponse&)> on_response) {
  return OpenStream(&v1::Monitor::Stub::async::NodeHeartbeat,
                    std::move(on_response));
}

}  // namespace gradsync
