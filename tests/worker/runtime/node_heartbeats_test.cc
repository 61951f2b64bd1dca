#include "worker/runtime/node_heartbeats.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/storage/in_memory_storage.h"
#include "tests/testing/eventually.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/runtime/health_reporter.h"

namespace gradsync {
namespace {

constexpr absl::Duration kPromptly = absl::Seconds(10);

// A coordinator on a loopback port (real clock; heartbeats every 100 ms)
// and nodes that join with all their processes at once.
class NodeHeartbeatsTest : public ::testing::Test {
 protected:
  // `max_heartbeat_rate` > 0 caps the coordinator's heartbeat ingest.
  void StartCoordinator(int port = 0, double max_heartbeat_rate = 0) {
    CoordinatorConfig config;
    config.storage = &storage_;  // kept across restarts
    config.listen_address = absl::StrCat("127.0.0.1:", port);
    config.poll_interval = absl::Milliseconds(5);
    config.health.heartbeat_interval = absl::Milliseconds(100);
    config.health.missed_heartbeats = 50;  // no loss from a slow test machine
    config.max_heartbeat_rate = max_heartbeat_rate;
    coordinator_ = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator_->Start().ok());
    port_ = coordinator_->port();
    if (client_ == nullptr) {  // kept across restarts, as the reporters are
      ClientOptions options;
      options.target = absl::StrCat("127.0.0.1:", port_);
      client_ = *GrpcCoordinatorClient::Create(options);
    }
  }

  // Joins one node of `nproc` processes to a one-node job `job`; their
  // assignments, and their incarnations in incarnations_[job].
  std::vector<v1::Assignment> JoinNode(const std::string& job, int nproc) {
    v1::JoinNodeRequest request;
    request.set_job_id(job);
    request.mutable_config()->set_job_id(job);
    request.mutable_config()->set_min_nodes(1);
    request.mutable_config()->set_nproc_per_node(nproc);
    for (int i = 0; i < nproc; ++i) {
      *request.add_processes()->mutable_node() = LocalNodeDescriptor();
      incarnations_[job].push_back(
          request.processes(i).node().incarnation_id());
    }
    absl::StatusOr<std::vector<v1::Assignment>> a = client_->JoinNode(request);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : std::vector<v1::Assignment>();
  }

  HealthReporterOptions Options(NodeHeartbeats* node) const {
    HealthReporterOptions options;
    options.interval = absl::Milliseconds(50);
    options.initial_backoff = absl::Milliseconds(10);
    options.max_backoff = absl::Milliseconds(100);
    options.open_stream = node->opener();
    return options;
  }

  v1::JobStatus Job(const std::string& job) {
    absl::StatusOr<v1::JobStatus> status = client_->GetJob(job);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  static v1::WorkerMetrics Step(int64_t step) {
    v1::WorkerMetrics m;
    m.set_state(v1::WORKER_STATE_TRAINING);
    m.set_step(step);
    return m;
  }

  InMemoryStorage storage_;
  std::unique_ptr<Coordinator> coordinator_;
  int port_ = 0;
  std::unique_ptr<CoordinatorClient> client_;
  std::map<std::string, std::vector<std::string>> incarnations_;
};

TEST_F(NodeHeartbeatsTest, RanksShareOneStreamAndTheirHeartbeatsGoTogether) {
  StartCoordinator();
  std::vector<v1::Assignment> members = JoinNode("shared", 3);
  ASSERT_EQ(members.size(), 3u);
  // A wide window: the three reporters' heartbeats, sent within
  // milliseconds of each other, always make one batch.
  NodeHeartbeats node(client_.get(), absl::Milliseconds(500));
  std::vector<std::unique_ptr<HealthReporter>> reporters;
  for (int i = 0; i < 3; ++i) {
    reporters.push_back(
        std::make_unique<HealthReporter>(client_.get(), Options(&node)));
    reporters[i]->Start(members[i], incarnations_["shared"][i]);
    reporters[i]->Update(Step(10 + members[i].rank()));
  }
  ASSERT_TRUE(Eventually([&] {
    v1::JobStatus job = Job("shared");
    for (const v1::Member& m : job.members()) {
      if (m.metrics().step() != 10 + m.rank()) return false;
    }
    return job.members_size() == 3;
  }));
  int64_t sent = 0;
  for (auto& reporter : reporters) {
    ASSERT_TRUE(Eventually(
        [&] { return reporter->verdict().state == v1::JOB_STATE_RUNNING; }));
    sent += reporter->stats().heartbeats_sent;
  }
  EXPECT_EQ(node.streams_opened(), 1);
  // Counted once Send returns, which may be after the coordinator read it.
  ASSERT_TRUE(Eventually([&] { return node.batches_sent() > 0; }));
  EXPECT_LT(node.batches_sent(), sent) << "heartbeats went out together";
  // Completion as usual: nobody is LOST when the lanes close.
  for (auto& reporter : reporters) {
    ASSERT_TRUE(reporter->Finish(true, 0, "").ok());
  }
  v1::JobStatus job = Job("shared");
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  for (const v1::Member& m : job.members()) {
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_EXITED);
  }
}

TEST_F(NodeHeartbeatsTest, AnErrorForOneMemberEndsOnlyItsLane) {
  StartCoordinator();
  v1::Assignment a = JoinNode("job-a", 1)[0];
  v1::Assignment b = JoinNode("job-b", 1)[0];
  NodeHeartbeats node(client_.get());
  HealthReporter reporter_a(client_.get(), Options(&node));
  HealthReporter reporter_b(client_.get(), Options(&node));
  absl::Notification b_over;
  absl::Status why;
  reporter_a.Start(a, incarnations_["job-a"][0]);
  reporter_b.Start(b, incarnations_["job-b"][0], [&](const absl::Status& s) {
    why = s;
    b_over.Notify();
  });
  ASSERT_TRUE(Eventually([&] {
    return reporter_a.stats().answers > 0 && reporter_b.stats().answers > 0;
  }));
  // A new process on job-b's node supersedes its round: b's lane ends with
  // ABORTED, a's carries on.
  JoinNode("job-b", 1);
  ASSERT_TRUE(b_over.WaitForNotificationWithTimeout(kPromptly));
  EXPECT_EQ(why.code(), absl::StatusCode::kAborted) << why;
  reporter_a.Update(Step(42));
  ASSERT_TRUE(
      Eventually([&] { return Job("job-a").members(0).metrics().step() == 42; }));
  EXPECT_EQ(reporter_a.stats().failed_streams, 0);
  EXPECT_EQ(node.streams_opened(), 1);
  reporter_b.Stop();
  reporter_a.Stop();
}

TEST_F(NodeHeartbeatsTest, ANewNodeStreamOpensAfterTheCoordinatorRestarts) {
  StartCoordinator();
  std::vector<v1::Assignment> members = JoinNode("restart", 2);
  NodeHeartbeats node(client_.get());
  std::vector<std::unique_ptr<HealthReporter>> reporters;
  for (int i = 0; i < 2; ++i) {
    reporters.push_back(
        std::make_unique<HealthReporter>(client_.get(), Options(&node)));
    reporters[i]->Start(members[i], incarnations_["restart"][i]);
  }
  ASSERT_TRUE(Eventually([&] {
    return reporters[0]->stats().answers > 0 &&
           reporters[1]->stats().answers > 0;
  }));
  coordinator_->Shutdown();
  coordinator_.reset();
  StartCoordinator(port_);  // same port, same state
  for (int i = 0; i < 2; ++i) reporters[i]->Update(Step(7 + i));
  ASSERT_TRUE(Eventually([&] {
    v1::JobStatus job = Job("restart");
    return job.members_size() == 2 && job.members(0).metrics().step() >= 7 &&
           job.members(1).metrics().step() >= 7 &&
           job.members(0).state() == v1::MEMBER_STATE_ACTIVE &&
           job.members(1).state() == v1::MEMBER_STATE_ACTIVE;
  }));
  EXPECT_GE(node.streams_opened(), 2);
  for (auto& reporter : reporters) reporter->Stop();
}

TEST_F(NodeHeartbeatsTest, RanksSlowDownTogetherWhenTheCoordinatorShedsLoad) {
  // 8 ranks at 100 ms are 80 heartbeats/s; the coordinator takes 20/s.
  StartCoordinator(/*port=*/0, /*max_heartbeat_rate=*/20);
  std::vector<v1::Assignment> members = JoinNode("slowed", 8);
  ASSERT_EQ(members.size(), 8u);
  NodeHeartbeats node(client_.get());
  std::vector<std::unique_ptr<HealthReporter>> reporters;
  for (int i = 0; i < 8; ++i) {
    reporters.push_back(
        std::make_unique<HealthReporter>(client_.get(), Options(&node)));
    reporters[i]->Start(members[i], incarnations_["slowed"][i]);
  }
  // Each lane's reporter sends at the interval its answers ask for, which
  // is the job's 100 ms times the coordinator's factor.
  absl::Duration slowed;
  ASSERT_TRUE(Eventually(
      [&] {
        const int factor = coordinator_->health().shedding().factor;
        slowed = absl::Milliseconds(100) * factor;
        if (factor == 1) return false;
        for (const auto& reporter : reporters) {
          if (reporter->interval() != slowed) return false;
        }
        return true;
      },
      absl::Seconds(30)));
  // 80/s at 100 ms fits 70% of 20/s at 8 x 100 ms.
  EXPECT_EQ(slowed, absl::Milliseconds(800));
  const int64_t batches = node.batches_sent();
  ASSERT_TRUE(Eventually([&] { return node.batches_sent() >= batches + 2; }));
  EXPECT_EQ(node.streams_opened(), 1);
  v1::JobStatus job = Job("slowed");
  ASSERT_EQ(job.members_size(), 8);
  for (const v1::Member& m : job.members()) {
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_ACTIVE);
  }
  EXPECT_THAT(job.diagnosis().overload(),
              ::testing::HasSubstr("every 800ms (the job's 100ms x8)"));
  for (auto& reporter : reporters) reporter->Stop();
}

}  // namespace
}  // namespace gradsync
