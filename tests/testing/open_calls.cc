#include "tests/testing/open_calls.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "proto/gradsync/v1/health.pb.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync::testing {
namespace {

v1::JoinRequest JoinRequest(const std::string& job, int min_nodes, int node) {
  v1::JoinRequest request;
  request.set_job_id(job);
  request.mutable_config()->set_job_id(job);
  request.mutable_config()->set_min_nodes(min_nodes);
  *request.mutable_config()->mutable_last_call_timeout() =
      ToProtoDuration(absl::ZeroDuration());
  *request.mutable_node() = LocalNodeDescriptor();
  request.mutable_node()->set_node_id(absl::StrCat("node-", node));
  return request;
}

}  // namespace

OpenCalls::OpenCalls(const std::string& address, absl::Duration join_bound,
                     int idle_streams)
    : join_bound_(join_bound), idle_streams_(idle_streams) {
  ClientOptions options;
  options.target = address;
  options.retry.max_attempts = 1;
  client_ = *GrpcCoordinatorClient::Create(options);
  setup_ = std::thread([this] {
    SetUp();
    setup_ended_.Notify();
  });
}

OpenCalls::~OpenCalls() {
  setup_.join();
  for (std::thread& t : waiting_) t.join();
}

bool OpenCalls::WaitUntilOpen(absl::Duration bound) {
  setup_ended_.WaitForNotificationWithTimeout(bound);
  return all_open_.HasBeenNotified();
}

void OpenCalls::SetUp() {
  std::vector<v1::JoinRequest> requests = {JoinRequest("train", 2, 0),
                                           JoinRequest("train", 2, 1)};
  std::vector<absl::StatusOr<v1::Assignment>> joined(
      2, absl::UnknownError("not joined"));
  std::thread second(
      [&] { joined[1] = client_->Join(requests[1], join_bound_); });
  joined[0] = client_->Join(requests[0], join_bound_);
  second.join();
  if (!joined[0].ok() || !joined[1].ok()) return;
  for (int i = 0; i < 2; ++i) {
    streams_.push_back(
        client_->OpenHeartbeatStream([](const v1::HeartbeatResponse&) {}));
    v1::HeartbeatRequest beat;
    beat.mutable_member()->set_job_id("train");
    beat.mutable_member()->set_round(joined[i]->round());
    beat.mutable_member()->set_rank(joined[i]->rank());
    beat.mutable_member()->set_incarnation_id(
        requests[i].node().incarnation_id());
    if (!streams_.back()->Send(beat)) return;
  }
  // Streams that sent nothing yet: the coordinator holds a read open on
  // each, which fails when shutdown cancels it, and the stream answers with
  // a Finish on its completion queue: many of those race the queues' own
  // shutdown.
  for (int i = 0; i < idle_streams_; ++i) {
    streams_.push_back(
        client_->OpenHeartbeatStream([](const v1::HeartbeatResponse&) {}));
  }
  v1::Scope scope;
  scope.set_job_id("train");
  scope.set_round(joined[0]->round());
  waiting_.emplace_back([this] {
    (void)client_->Join(JoinRequest("waits-for-a-second-node", 2, 0),
                        join_bound_);
  });
  waiting_.emplace_back([this, scope] {
    (void)client_->Wait(scope, {"never-set"}, absl::Seconds(30));
  });
  waiting_.emplace_back([this] {
    (void)client_->WatchJob("train", absl::Milliseconds(100), false,
                            [this](const v1::JobStatus&) {
                              if (!watching_.HasBeenNotified()) {
                                watching_.Notify();
                              }
                              return true;
                            });
    if (!watching_.HasBeenNotified()) watching_.Notify();
  });
  watching_.WaitForNotification();  // the watch's first status arrived
  all_open_.Notify();
}

}  // namespace gradsync::testing
