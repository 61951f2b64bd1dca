// Past its heartbeat capacity, the real gradsync-coordinator: 200 members
// heartbeating every 100 ms (2,000/s, each on its own stream, as worker
// processes do) against a coordinator that handles at most 250 heartbeats/s
// (--max_heartbeat_rate: the overload is reached cheaply and the same on
// any machine). With shedding (the default) it slows the members down and
// no live member is LOST; without it (--shed_heartbeats=false), the same
// load makes it declare live members LOST, which is what shows the load is
// past its capacity. Jobs use failure_policy FAIL: one member LOST fails
// the job, so a false loss cannot go unseen.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/eventually.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/runtime/health_reporter.h"

namespace gradsync {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testing::CoordinatorProcess;
using testing::Runfile;
using testing::TempPath;

constexpr int kMembers = 200;
constexpr int kConnections = 4;  // the members' streams share them
constexpr absl::Duration kInterval = absl::Milliseconds(100);
// An eighth of the 2,000 heartbeats/s the members send.
constexpr int kCapacity = 250;
// How long overload, shedding and the members hearing of it may take on a
// loaded 2-core machine.
constexpr absl::Duration kBound = absl::Seconds(30);

class OverloadProcessTest : public ::testing::Test {
 protected:
  void TearDown() override {
    // The coordinator first: with its backlog it would take long to see
    // each stream close; its end ends them all.
    if (started_) EXPECT_TRUE(coordinator_.Stop());
    for (auto& reporter : reporters_) reporter->Stop();
  }

  // Starts the coordinator capped at kCapacity heartbeats/s, with `flags`.
  void StartCoordinator(const std::string& name,
                        std::vector<std::string> flags) {
    const std::string metrics_port_file = TempPath("metrics-port-" + name);
    flags.insert(flags.end(),
                 {absl::StrCat("--max_heartbeat_rate=", kCapacity),
                  absl::StrCat("--heartbeat_interval=",
                               absl::FormatDuration(kInterval)),
                  "--metrics_listen=127.0.0.1:0",
                  "--metrics_port_file=" + metrics_port_file});
    ASSERT_TRUE(coordinator_.Start(Runfile("server/gradsync-coordinator"),
                                   name, flags));
    started_ = true;
    std::ifstream in(metrics_port_file);
    in >> metrics_port_;
    ASSERT_GT(metrics_port_, 0);
    for (int i = 0; i < kConnections; ++i) {
      ClientOptions options;
      options.target = coordinator_.address();
      clients_.push_back(*GrpcCoordinatorClient::Create(options));
    }
  }

  // Joins kMembers processes (one node) to job `job`, which fails when a
  // member is LOST, and starts their heartbeats.
  void StartMembers(const std::string& job) {
    v1::JoinNodeRequest request;
    request.set_job_id(job);
    request.mutable_config()->set_job_id(job);
    request.mutable_config()->set_min_nodes(1);
    request.mutable_config()->set_nproc_per_node(kMembers);
    request.mutable_config()->set_failure_policy(v1::FAILURE_POLICY_FAIL);
    for (int i = 0; i < kMembers; ++i) {
      *request.add_processes()->mutable_node() = LocalNodeDescriptor();
    }
    absl::StatusOr<std::vector<v1::Assignment>> assignments =
        clients_[0]->JoinNode(request);
    ASSERT_TRUE(assignments.ok()) << assignments.status();
    ASSERT_EQ(assignments->size(), static_cast<size_t>(kMembers));
    for (int i = 0; i < kMembers; ++i) {
      CoordinatorClient* client = clients_[i % kConnections].get();
      HealthReporterOptions options;
      options.interval = kInterval;
      options.close_timeout = absl::Milliseconds(100);
      reporters_.push_back(std::make_unique<HealthReporter>(client, options));
      reporters_.back()->Start((*assignments)[i],
                               request.processes(i).node().incarnation_id());
    }
  }

  absl::StatusOr<v1::JobStatus> Job(const std::string& job) {
    return clients_[0]->GetJob(job);
  }

  // A sample of the coordinator's metrics without labels; -1 if absent.
  double Metric(const std::string& name) {
    httplib::Client http("127.0.0.1", metrics_port_);
    httplib::Result response = http.Get("/metrics");
    if (!response || response->status != 200) return -1;
    for (absl::string_view line :
         absl::StrSplit(response->body, '\n', absl::SkipEmpty())) {
      double value = 0;
      if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, " ") &&
          absl::SimpleAtod(line, &value)) {
        return value;
      }
    }
    return -1;
  }

  CoordinatorProcess coordinator_;
  bool started_ = false;
  int metrics_port_ = 0;
  std::vector<std::unique_ptr<CoordinatorClient>> clients_;
  std::vector<std::unique_ptr<HealthReporter>> reporters_;
};

TEST_F(OverloadProcessTest, WithoutSheddingLiveMembersAreLost) {
  StartCoordinator("unshed", {"--shed_heartbeats=false"});
  StartMembers("unshed");
  // Every member heartbeats, yet past capacity some are found LOST.
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::JobStatus> job = Job("unshed");
        return job.ok() && job->state() == v1::JOB_STATE_FAILED;
      },
      kBound));
  absl::StatusOr<v1::JobStatus> job = Job("unshed");
  ASSERT_TRUE(job.ok()) << job.status();
  // Lost after heartbeats were handled, or before the first one was (its
  // turn under the cap came too late): either way a live member.
  EXPECT_THAT(job->reason(), AnyOf(HasSubstr("lost: missed 3 heartbeats"),
                                   HasSubstr("lost: sent no heartbeat")));
  EXPECT_EQ(Metric("gradsync_heartbeat_shed_periods_total"), 0);
}

TEST_F(OverloadProcessTest, PastCapacityNoLiveMemberIsLost) {
  StartCoordinator("shed", {});
  StartMembers("shed");
  // The coordinator sheds, and every member sends at the interval it asks.
  int factor = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        factor = static_cast<int>(Metric("gradsync_heartbeat_interval_factor"));
        if (factor <= 1) return false;
        for (const auto& reporter : reporters_) {
          if (reporter->interval() != kInterval * factor) return false;
        }
        return true;
      },
      kBound))
      << "factor " << factor;
  // 2,000/s fits 70% of 250/s at 16 x 100 ms.
  EXPECT_EQ(factor, 16);
  EXPECT_EQ(Metric("gradsync_heartbeat_overloaded"), 1);
  EXPECT_EQ(Metric("gradsync_heartbeat_interval_seconds"),
            absl::ToDoubleSeconds(kInterval * factor));
  EXPECT_GE(Metric("gradsync_heartbeat_shed_periods_total"), 1);

  // Then every member is heard from twice more on average.
  const double heartbeats = Metric("gradsync_heartbeats_total");
  ASSERT_TRUE(Eventually(
      [&] { return Metric("gradsync_heartbeats_total") >= heartbeats + 2 * kMembers; },
      kBound));
  absl::StatusOr<v1::JobStatus> job = Job("shed");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING) << job->reason();
  ASSERT_EQ(job->members_size(), kMembers);
  for (const v1::Member& m : job->members()) {
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_ACTIVE)
        << "rank " << m.rank() << ": " << m.state_reason();
  }
  EXPECT_THAT(job->diagnosis().overload(),
              HasSubstr("the coordinator is past its heartbeat capacity and "
                        "sheds load"));
  EXPECT_THAT(job->diagnosis().overload(),
              HasSubstr(absl::StrCat("every ",
                                     absl::FormatDuration(kInterval * factor))));
}

}  // namespace
}  // namespace gradsync
