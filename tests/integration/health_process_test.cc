// Failure detection with real processes: gradsync-coordinator with its
// default heartbeat settings (1 s, 3 missed), gradsync-sim-worker processes
// that train with heartbeats, and the gradsync CLI. Workers are killed with
// SIGKILL or stopped with SIGSTOP and must show as LOST within the bound.
#include <signal.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/eventually.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::Child;
using testing::CoordinatorProcess;
using testing::Runfile;
using testing::WaitAll;

constexpr absl::Duration kTrainingBound = absl::Seconds(60);
// The bound with the defaults: 3 missed heartbeats of 1 s.
constexpr absl::Duration kLostBound = absl::Seconds(3);

class HealthProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    ASSERT_TRUE(coordinator_.Start(Runfile("server/gradsync-coordinator"),
                                   info->name()));
    ClientOptions options;
    options.target = coordinator_.address();
    client_ = *GrpcCoordinatorClient::Create(options);
  }

  void TearDown() override { EXPECT_TRUE(coordinator_.Stop()); }

  // Starts `world` sim workers of `job` (one node each) that train `steps`
  // steps of `step_time`; `extra[i]` are more flags for worker i.
  std::vector<std::unique_ptr<Child>> StartWorkers(
      const std::string& job, int world, int64_t steps,
      absl::Duration step_time,
      std::map<int, std::vector<std::string>> extra = {}) {
    std::vector<std::unique_ptr<Child>> workers;
    for (int i = 0; i < world; ++i) {
      std::vector<std::string> argv = {
          Runfile("worker/gradsync-sim-worker"),
          absl::StrCat("--coordinator=", coordinator_.address()),
          absl::StrCat("--job=", job),
          absl::StrCat("--nnodes=", world),
          absl::StrCat("--node_id=node-", i),
          "--last_call_timeout=0s",
          absl::StrCat("--train_steps=", steps),
          absl::StrCat("--step_time=", absl::FormatDuration(step_time))};
      argv.insert(argv.end(), extra[i].begin(), extra[i].end());
      workers.push_back(std::make_unique<Child>());
      EXPECT_TRUE(workers.back()->Start(argv, /*capture=*/true));
    }
    return workers;
  }

  absl::StatusOr<v1::JobStatus> Job(const std::string& job) {
    return client_->GetJob(job);
  }

  // Waits until every member of `job` has reported at least one step.
  bool AllTraining(const std::string& job, int world) {
    return Eventually(
        [&] {
          absl::StatusOr<v1::JobStatus> status = Job(job);
          if (!status.ok() || status->members_size() != world) return false;
          for (const v1::Member& m : status->members()) {
            if (m.metrics().step() == 0) return false;
          }
          return true;
        },
        kTrainingBound);
  }

  // The worker process that holds `rank`.
  Child* WorkerOfRank(const std::string& job, int rank,
                      const std::vector<std::unique_ptr<Child>>& workers) {
    absl::StatusOr<v1::JobStatus> status = Job(job);
    if (!status.ok()) return nullptr;
    for (const auto& w : workers) {
      if (w->pid() == status->members(rank).node().pid()) return w.get();
    }
    return nullptr;
  }

  // Once every member of `job` trains, sends `signal_number` to the worker
  // of `rank` and returns how long the coordinator took to show that rank
  // LOST (infinite when it did not within kLostBound plus a margin).
  absl::Duration SignalAndTimeLost(
      const std::string& job, int rank, int signal_number,
      const std::vector<std::unique_ptr<Child>>& workers) {
    if (!AllTraining(job, static_cast<int>(workers.size()))) {
      ADD_FAILURE() << "job '" << job << "' never trained";
      return absl::InfiniteDuration();
    }
    Child* victim = WorkerOfRank(job, rank, workers);
    if (victim == nullptr) {
      ADD_FAILURE() << "no worker holds rank " << rank;
      return absl::InfiniteDuration();
    }
    const absl::Time signalled = absl::Now();
    victim->Signal(signal_number);
    const bool lost = Eventually(
        [&] {
          absl::StatusOr<v1::JobStatus> status = Job(job);
          return status.ok() &&
                 status->members(rank).state() == v1::MEMBER_STATE_LOST;
        },
        kLostBound + absl::Seconds(5));
    const absl::Duration took =
        lost ? absl::Now() - signalled : absl::InfiniteDuration();
    std::printf("%s: rank %d shown LOST %s after signal %d\n", job.c_str(),
                rank, absl::FormatDuration(took).c_str(), signal_number);
    return took;
  }

  // Ends the workers that still run (stopped ones included).
  static void KillAll(const std::vector<std::unique_ptr<Child>>& workers) {
    std::vector<Child*> all;
    for (const auto& w : workers) {
      w->Signal(SIGKILL);
      all.push_back(w.get());
    }
    EXPECT_TRUE(WaitAll(all, absl::Seconds(10)));
  }

  CoordinatorProcess coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
};

// The killed worker's stream breaks at once; its peer (a simulated worker:
// no collectives to fail) does not notice, so the coordinator waits out the
// reconnect grace (the missed-heartbeat window, 3 s) before LOST.
TEST_F(HealthProcessTest, KilledWorkerIsLostWhenItsReconnectGraceEnds) {
  auto workers = StartWorkers("killed", 2, 100000, absl::Milliseconds(100));
  const absl::Duration took = SignalAndTimeLost("killed", 1, SIGKILL, workers);
  EXPECT_GE(took, absl::Milliseconds(2900));
  EXPECT_LE(took, kLostBound + absl::Seconds(1));
  // Recover (the default): the job shows DEGRADED as the loss is seen, then
  // WAITING once the rendezvous has superseded the round for the survivors
  // to re-form; the second step may come a moment after the first.
  absl::StatusOr<v1::JobStatus> status;
  EXPECT_TRUE(Eventually(
      [&] {
        status = Job("killed");
        return status.ok() && status->state() == v1::JOB_STATE_WAITING;
      },
      absl::Seconds(10)))
      << (status.ok() ? status->DebugString() : status.status().ToString());
  ASSERT_TRUE(status.ok());
  EXPECT_THAT(status->reason(), HasSubstr("rank 1"));
  EXPECT_THAT(status->reason(),
              HasSubstr("did not heartbeat again within 3s"));
  KillAll(workers);
}

TEST_F(HealthProcessTest, HungWorkerIsLostAfterThreeMissedHeartbeats) {
  auto workers = StartWorkers("hung", 2, 100000, absl::Milliseconds(100));
  // A stopped process keeps its connection open but sends nothing.
  const absl::Duration took = SignalAndTimeLost("hung", 0, SIGSTOP, workers);
  // LOST 3 s after its last heartbeat, which was at most 1 s before the
  // stop; the slack above the bound is for a loaded test machine.
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LE(took, kLostBound + absl::Seconds(1));
  absl::StatusOr<v1::JobStatus> status = Job("hung");
  ASSERT_TRUE(status.ok());
  EXPECT_THAT(status->members(0).state_reason(), HasSubstr("missed 3 heartbeats"));
  KillAll(workers);
}

TEST_F(HealthProcessTest, WatchFollowsTheJobUntilItSucceeds) {
  auto workers = StartWorkers("short", 2, 30, absl::Milliseconds(50));
  ASSERT_TRUE(Eventually([&] { return Job("short").ok(); }, kTrainingBound));
  Child watch;
  ASSERT_TRUE(watch.Start({Runfile("cli/gradsync"),
                           absl::StrCat("--coordinator=", coordinator_.address()),
                           "watch", "short", "--json", "--interval=100ms"},
                          /*capture=*/true));
  std::vector<Child*> all = {&watch};
  for (auto& w : workers) all.push_back(w.get());
  ASSERT_TRUE(WaitAll(all, kTrainingBound));
  for (auto& w : workers) {
    EXPECT_EQ(w->exit_code(), 0) << w->describe();
    EXPECT_THAT(w->out(), HasSubstr("trained 30 steps"));
  }
  ASSERT_EQ(watch.exit_code(), 0) << watch.describe();
  std::vector<std::string> lines =
      absl::StrSplit(watch.out(), '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u) << watch.out();
  nlohmann::json last = nlohmann::json::parse(lines.back());
  EXPECT_EQ(last["state"], "succeeded");
  EXPECT_EQ(last["members"][0]["state"], "exited");
  EXPECT_EQ(last["members"][0]["step"], 30);
  // Some update showed the job running with training metrics.
  bool saw_training = false;
  for (const std::string& line : lines) {
    nlohmann::json j = nlohmann::json::parse(line);
    saw_training |= j["state"] == "running" && j["members"][0].contains("step");
  }
  EXPECT_TRUE(saw_training);
}

TEST_F(HealthProcessTest, SlowRankIsFlaggedWithItsLag) {
  auto workers = StartWorkers("lagging", 3, 60, absl::Milliseconds(50),
                              {{2, {"--lag=300ms"}}});
  ASSERT_TRUE(AllTraining("lagging", 3));
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::JobStatus> status = Job("lagging");
        return status.ok() && status->diagnosis().stragglers_size() > 0;
      },
      kTrainingBound));
  absl::StatusOr<v1::JobStatus> status = Job("lagging");
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->diagnosis().stragglers_size(), 1);
  const v1::Straggler& straggler = status->diagnosis().stragglers(0);
  EXPECT_EQ(status->members(straggler.rank()).node().pid(), workers[2]->pid());
  // Lags are wall-clock differences on one host: 300 ms give or take the
  // processes' start skew, which t0 removes.
  EXPECT_GE(FromProtoDuration(straggler.lag()), absl::Milliseconds(250));
  EXPECT_LE(FromProtoDuration(straggler.lag()), absl::Milliseconds(350));
  std::vector<Child*> all;
  for (auto& w : workers) all.push_back(w.get());
  EXPECT_TRUE(WaitAll(all, kTrainingBound));
}

TEST_F(HealthProcessTest, DesyncedRankFailsTheJobAndStopsTheWorkers) {
  auto workers = StartWorkers("desynced", 2, 100000, absl::Milliseconds(50),
                              {{1, {"--desync_at=7"}}});
  std::vector<Child*> all;
  for (auto& w : workers) all.push_back(w.get());
  // The workers hear the verdict on their heartbeat stream and stop.
  ASSERT_TRUE(WaitAll(all, kTrainingBound));
  for (auto& w : workers) {
    EXPECT_EQ(w->exit_code(), 1) << w->describe();
    EXPECT_THAT(w->err(), HasSubstr("collectives desynchronized at #7"));
  }
  absl::StatusOr<v1::JobStatus> status = Job("desynced");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status->diagnosis().desync(),
              HasSubstr("allreduce of 1024 float32 (bucket 0)"));
  EXPECT_THAT(status->diagnosis().desync(),
              HasSubstr("allreduce of 1025 float32 (bucket 0)"));
}

}  // namespace
}  // namespace gradsync
