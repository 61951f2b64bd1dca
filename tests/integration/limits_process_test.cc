// The coordinator's limits with the real binary: past --max_world_size,
// --max_jobs, --max_kv_keys_per_job and --max_streams_per_connection a call
// is RESOURCE_EXHAUSTED naming the flag, changes nothing, and the
// coordinator goes on serving.
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/eventually.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::CoordinatorProcess;
using testing::Runfile;

class LimitsProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(coordinator_.Start(
        Runfile("server/gradsync-coordinator"), "limits",
        {"--max_jobs=2", "--max_world_size=4", "--max_kv_keys_per_job=3",
         "--missed_heartbeats=100", "--max_streams_per_connection=2"}));
    ClientOptions options;
    options.target = coordinator_.address();
    client_ = *GrpcCoordinatorClient::Create(options);
  }
  void TearDown() override { EXPECT_TRUE(coordinator_.Stop()); }

  // One process joining job `job` of `nodes` nodes (a round of one node
  // closes at once).
  absl::StatusOr<v1::Assignment> Join(const std::string& job, int nodes) {
    v1::JoinRequest request;
    request.set_job_id(job);
    request.mutable_config()->set_job_id(job);
    request.mutable_config()->set_min_nodes(1);
    request.mutable_config()->set_max_nodes(nodes);
    request.mutable_config()->mutable_last_call_timeout()->set_seconds(0);
    *request.mutable_node() = LocalNodeDescriptor();
    incarnation_ = request.node().incarnation_id();
    return client_->Join(request);
  }

  CoordinatorProcess coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
  std::string incarnation_;  // of the last Join
};

TEST_F(LimitsProcessTest, PastALimitCallsAreRefusedNamingTheFlag) {
  absl::StatusOr<v1::Assignment> big = Join("big", 5);
  EXPECT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  EXPECT_THAT(big.status().message(), HasSubstr("(--max_world_size)"));

  absl::StatusOr<v1::Assignment> a = Join("a", 1);
  ASSERT_TRUE(a.ok()) << a.status();
  v1::Scope scope;
  scope.set_job_id("a");
  scope.set_round(a->round());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client_->Set(scope, absl::StrCat("k", i), "v").ok());
  }
  absl::Status full = client_->Set(scope, "k3", "v");
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(full.message(), HasSubstr("(--max_kv_keys_per_job)"));
  EXPECT_TRUE(absl::IsNotFound(client_->Get(scope, "k3").status()));

  ASSERT_TRUE(Join("b", 1).ok());
  absl::StatusOr<v1::Assignment> c = Join("c", 1);
  EXPECT_TRUE(absl::IsResourceExhausted(c.status())) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("(--max_jobs=2)"));

  // Still serving, with only what was allowed.
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 2u);
  EXPECT_TRUE(client_->Get(scope, "k0").ok());
}

TEST_F(LimitsProcessTest, AConnectionHoldsAtMostItsStreams) {
  absl::StatusOr<v1::Assignment> a = Join("streams", 1);
  ASSERT_TRUE(a.ok()) << a.status();
  // Two streams on the client's one connection: a node's heartbeats and a
  // watch; a third stream is refused, naming the flag.
  auto node = client_->OpenNodeHeartbeatStream(
      [](const v1::NodeHeartbeatResponse&) {});
  v1::NodeHeartbeatRequest beat;
  v1::MemberRef* member = beat.add_heartbeats()->mutable_member();
  member->set_job_id("streams");
  member->set_round(a->round());
  member->set_rank(a->rank());
  member->set_incarnation_id(incarnation_);
  ASSERT_TRUE(node->Send(beat));
  absl::Notification watching;
  absl::Status watched;
  std::thread watcher([&] {
    watched = client_->WatchJob("streams", absl::Milliseconds(100), false,
                                [&](const v1::JobStatus&) {
                                  if (!watching.HasBeenNotified()) {
                                    watching.Notify();
                                  }
                                  return true;
                                });
  });
  ASSERT_TRUE(watching.WaitForNotificationWithTimeout(absl::Seconds(30)));
  auto third = client_->OpenHeartbeatStream([](const v1::HeartbeatResponse&) {});
  ASSERT_TRUE(Eventually([&] { return third->ended().has_value(); },
                         absl::Seconds(30)));
  EXPECT_TRUE(absl::IsResourceExhausted(*third->ended())) << *third->ended();
  EXPECT_THAT(third->ended()->message(),
              HasSubstr("(--max_streams_per_connection=2)"));
  absl::Status refused_watch = client_->WatchJob(
      "streams", absl::Milliseconds(100), false,
      [](const v1::JobStatus&) { return true; });
  EXPECT_TRUE(absl::IsResourceExhausted(refused_watch)) << refused_watch;
  // A stream that ends gives its place back.
  EXPECT_TRUE(node->Close(absl::Seconds(30)).ok());
  node.reset();
  absl::Notification answered;
  auto again = client_->OpenHeartbeatStream([&](const v1::HeartbeatResponse&) {
    if (!answered.HasBeenNotified()) answered.Notify();
  });
  v1::HeartbeatRequest heartbeat;
  *heartbeat.mutable_member() = beat.heartbeats(0).member();
  ASSERT_TRUE(again->Send(heartbeat));
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(again->ended().has_value()) << *again->ended();
  EXPECT_TRUE(again->Close(absl::Seconds(30)).ok());
  ASSERT_TRUE(client_->ReportCompletion([&] {
    v1::ReportCompletionRequest done;
    *done.mutable_member() = heartbeat.member();
    done.set_success(true);
    return done;
  }()).ok());
  watcher.join();  // the watch ends with the job
  EXPECT_TRUE(watched.ok()) << watched;
}

}  // namespace
}  // namespace gradsync
