#include "server/monitor_service.h"

#include <atomic>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"

namespace gradsync {
namespace {

// One worker's heartbeat stream. Reads one heartbeat at a time into the same
// message (its capacity is reused); answers only when HealthManager says so,
// one write at a time. A stream that ends by cancellation (the worker died
// or its connection broke) reports its member's stream broken.
// Lifetime: created by the handler, deleted in OnDone.
class HeartbeatReactor final
    : public grpc::ServerBidiReactor<v1::HeartbeatRequest,
                                     v1::HeartbeatResponse> {
 public:
  HeartbeatReactor(HealthManager* health, grpc::CallbackServerContext* context)
      : health_(health),
        context_(context),
        session_(HealthManager::NewSession()) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the worker closed its side, or the stream broke
      FinishOnce(grpc::Status::OK);
      return;
    }
    v1::HeartbeatResponse response;
    absl::StatusOr<bool> answer =
        health_->Heartbeat(session_.get(), &request_, &response);
    if (!answer.ok()) {
      FinishOnce(ToGrpcStatus(answer.status()));
      return;
    }
    if (*answer) Send(std::move(response));
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) return;  // the stream is over; OnReadDone finishes it
    if (next_.has_value()) {
      writing_ = true;
      outgoing_ = std::move(*next_);
      next_.reset();
      StartWrite(&outgoing_);
    } else if (finish_.has_value()) {
      Finish(*finish_);
    }
  }

  void OnCancel() override { cancelled_.store(true); }

  void OnDone() override {
    // Every other reaction has run: the session is no longer in use.
    if (cancelled_.load() || context_->IsCancelled()) {
      health_->StreamBroken(session_.get());
    }
    delete this;
  }

 private:
  void Send(v1::HeartbeatResponse response) {
    absl::MutexLock lock(&mu_);
    if (finish_.has_value()) return;
    if (writing_) {
      next_ = std::move(response);  // only the latest state matters
      return;
    }
    writing_ = true;
    outgoing_ = std::move(response);
    StartWrite(&outgoing_);
  }

  // Finishes now, or after the write in flight.
  void FinishOnce(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (finish_.has_value()) return;
    finish_ = std::move(status);
    next_.reset();
    if (!writing_) Finish(*finish_);
  }

  HealthManager* const health_;
  grpc::CallbackServerContext* const context_;
  const std::unique_ptr<HealthManager::Session> session_;
  v1::HeartbeatRequest request_;  // used by OnReadDone only
  std::atomic<bool> cancelled_{false};

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  v1::HeartbeatResponse outgoing_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::HeartbeatResponse> next_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>*
MonitorService::Heartbeat(grpc::CallbackServerContext* context) {
  return new HeartbeatReactor(health_, context);
}

grpc::ServerUnaryReactor* MonitorService::ReportCompletion(
    grpc::CallbackServerContext* context,
    const v1::ReportCompletionRequest* request,
    v1::ReportCompletionResponse* response) {
  absl::StatusOr<v1::JobState> state = health_->ReportCompletion(*request);
  if (state.ok()) response->set_job_state(*state);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(state.status()));
  return reactor;
}

}  // namespace gradsync
