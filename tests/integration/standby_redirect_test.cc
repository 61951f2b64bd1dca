// A coordinator replica that stands by (StandbyServer) answers every call
// with UNAVAILABLE naming the leader, and CoordinatorClient, given the
// standby's address first, follows it to the leader: unary calls at once,
// a heartbeat stream from its next opening. When that leader goes away the
// client tries the whole list again.
#include "server/standby_server.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/host_ports.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "server/coordinator.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

std::string Local(int port) { return absl::StrCat("127.0.0.1:", port); }

// One GetJob straight to `address`, with the answer's trailing metadata.
struct RawAnswer {
  grpc::Status status;
  std::string leader;  // kLeaderMetadataKey, if any
};
RawAnswer AskDirectly(const std::string& address) {
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::Jobs::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::GetJobRequest request;
  request.set_job_id("any");
  v1::GetJobResponse response;
  RawAnswer answer;
  answer.status = stub->GetJob(&context, request, &response);
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kLeaderMetadataKey);
  if (it != trailers.end()) answer.leader.assign(it->second.data(), it->second.size());
  return answer;
}

TEST(StandbyServerTest, AnswersEveryCallWithTheLeader) {
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby =
      StandbyServer::Start("127.0.0.1:0");
  ASSERT_TRUE(standby.ok()) << standby.status();
  const int port = (*standby)->port();
  RawAnswer none = AskDirectly(Local(port));
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(none.status.error_message(),
              HasSubstr("stands by; no replica leads yet"));
  EXPECT_EQ(none.leader, "");
  (*standby)->SetLeader("10.0.0.5:29400");
  RawAnswer named = AskDirectly(Local(port));
  EXPECT_EQ(named.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(named.status.error_message(),
              HasSubstr("the leader is at 10.0.0.5:29400"));
  EXPECT_EQ(named.leader, "10.0.0.5:29400");
  // Stopped, it frees the address for the coordinator.
  standby->reset();
  absl::StatusOr<std::unique_ptr<StandbyServer>> again =
      StandbyServer::Start(Local(port));
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(StandbyServerTest, ClientGivenTheStandbyFirstFollowsTheLeader) {
  CoordinatorConfig config;
  config.listen_address = "127.0.0.1:0";
  config.shutdown_grace = absl::ZeroDuration();
  Coordinator leader(config);
  ASSERT_TRUE(leader.Start().ok());
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby =
      StandbyServer::Start("127.0.0.1:0");
  ASSERT_TRUE(standby.ok()) << standby.status();
  (*standby)->SetLeader(Local(leader.port()));

  ClientOptions options;
  options.target =
      absl::StrCat(Local((*standby)->port()), ",", Local(leader.port()));
  options.retry.budget = absl::Seconds(3);
  auto client = GrpcCoordinatorClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  // The heartbeat stream opened first reaches the standby, and ends with
  // its answer...
  auto first = (*client)->OpenHeartbeatStream([](const auto&) {});
  absl::Status ended = first->Close(absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(ended)) << ended;
  EXPECT_THAT(ended.message(), HasSubstr("stands by"));
  // ...which moves the client: unary calls and the next stream reach the
  // leader.
  v1::JobConfig job;
  job.set_job_id("followed");
  job.set_min_nodes(1);
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*client)->CreateJob(job).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "no retry backoff";
  auto second = (*client)->OpenHeartbeatStream([](const auto&) {});
  v1::HeartbeatRequest beat;
  beat.mutable_member()->set_job_id("followed");
  beat.mutable_member()->set_round(1);
  beat.mutable_member()->set_incarnation_id("nobody");
  ASSERT_TRUE(second->Send(beat));
  absl::Status refused = second->Close(absl::Seconds(10));
  EXPECT_FALSE(absl::IsUnavailable(refused))
      << "the leader answers for itself: " << refused;

  // The leader goes away and the standby knows none: calls try the list
  // again, and fail naming both addresses once the budget is spent.
  leader.Shutdown();
  (*standby)->SetLeader("");
  absl::StatusOr<v1::JobStatus> lost = (*client)->GetJob("followed");
  EXPECT_TRUE(absl::IsUnavailable(lost.status())) << lost.status();
  EXPECT_THAT(lost.status().message(), HasSubstr(options.target));
}

// A client given the standby alone and a stale leader does not loop: each
// round trip through the list pays the retry backoff.
TEST(StandbyServerTest, StaleLeaderIsRetriedWithBackoffWithinTheBudget) {
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby =
      StandbyServer::Start("127.0.0.1:0");
  ASSERT_TRUE(standby.ok()) << standby.status();
  (*standby)->SetLeader("127.0.0.1:1");  // nothing listens there
  ClientOptions options;
  options.target = Local((*standby)->port());
  options.retry.budget = absl::Seconds(2);
  auto client = GrpcCoordinatorClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JobStatus> status = (*client)->GetJob("any");
  EXPECT_TRUE(absl::IsUnavailable(status.status())) << status.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "bounded by the budget";
}

}  // namespace
}  // namespace gradsync
