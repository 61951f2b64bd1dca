// gradsync-coordinator --state_dir: a job keeps training through a kill -9
// of the coordinator and a restart on the same address and state, and its
// keys and result are kept; a second coordinator on a state directory in use
// is refused at start with a clear error.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::TempPath;
using ::gradsync::testing::WaitAll;
using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(60);

std::unique_ptr<CoordinatorClient> Client(const std::string& address) {
  ClientOptions options;
  options.target = address;
  return *CoordinatorClient::Create(options);
}

// Starts `world` simulated workers of `job` that train for `steps` steps.
std::vector<std::unique_ptr<Child>> StartWorkers(const std::string& address,
                                                 const std::string& job,
                                                 int world, int steps) {
  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < world; ++i) {
    workers.push_back(std::make_unique<Child>());
    EXPECT_TRUE(workers.back()->Start(
        {Runfile("worker/gradsync-sim-worker"),
         absl::StrCat("--coordinator=", address), absl::StrCat("--job=", job),
         absl::StrCat("--nnodes=", world), absl::StrCat("--node_id=node-", i),
         "--last_call_timeout=0s", absl::StrCat("--train_steps=", steps),
         "--step_time=20ms"},
        /*capture=*/true));
  }
  return workers;
}

TEST(DurableStateProcessTest, TrainingGoesOnThroughKillNineAndRestart) {
  const std::string state_dir = TempPath("state-mid-training");
  CoordinatorProcess first;
  ASSERT_TRUE(first.Start(Runfile("server/gradsync-coordinator"), "mid-1",
                          {absl::StrCat("--state_dir=", state_dir)}));
  // 150 steps of 20 ms: about 3 s of training, through the outage.
  std::vector<std::unique_ptr<Child>> workers =
      StartWorkers(first.address(), "live", 2, 150);
  auto client = Client(first.address());
  absl::StatusOr<v1::JobStatus> job;
  for (int i = 0; i < 200; ++i) {  // until the round closed (at most 10 s)
    job = client->GetJob("live");
    if (job.ok() && job->state() == v1::JOB_STATE_RUNNING) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(job.ok() && job->state() == v1::JOB_STATE_RUNNING)
      << job.status();
  v1::Scope scope;
  scope.set_job_id("live");
  scope.set_round(job->round());
  ASSERT_TRUE(client->Set(scope, "set-before-the-crash", "kept").ok());

  first.child().Signal(SIGKILL);
  ASSERT_TRUE(WaitAll({&first.child()}, kBound));
  CoordinatorProcess second;  // the same port and state
  ASSERT_TRUE(second.Start(Runfile("server/gradsync-coordinator"), "mid-2",
                           {absl::StrCat("--state_dir=", state_dir),
                            absl::StrCat("--listen=", first.address())}));
  ASSERT_EQ(second.address(), first.address());

  std::vector<Child*> children;
  for (auto& worker : workers) children.push_back(worker.get());
  ASSERT_TRUE(WaitAll(children, kBound));
  for (auto& worker : workers) {
    EXPECT_EQ(worker->exit_code(), 0) << worker->describe();
  }
  auto after = Client(second.address());
  job = after->GetJob("live");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
  for (const v1::Member& member : job->members()) {
    EXPECT_EQ(member.state(), v1::MEMBER_STATE_EXITED)
        << "rank " << member.rank() << ": " << member.state_reason();
  }
  absl::StatusOr<std::string> kept = after->Get(scope, "set-before-the-crash");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "kept");
  ASSERT_TRUE(second.Stop());
}

TEST(DurableStateProcessTest, AJobsResultIsKeptThroughKillNineAndRestart) {
  const std::string state_dir = TempPath("state-kill-nine");
  CoordinatorProcess first;
  ASSERT_TRUE(first.Start(Runfile("server/gradsync-coordinator"), "durable-1",
                          {absl::StrCat("--state_dir=", state_dir)}));
  std::vector<std::unique_ptr<Child>> workers =
      StartWorkers(first.address(), "kept", 2, 5);
  ASSERT_TRUE(WaitAll({workers[0].get(), workers[1].get()}, kBound));
  for (auto& worker : workers) ASSERT_EQ(worker->exit_code(), 0) << worker->describe();

  first.child().Signal(SIGKILL);
  ASSERT_TRUE(WaitAll({&first.child()}, kBound));

  CoordinatorProcess second;
  ASSERT_TRUE(second.Start(Runfile("server/gradsync-coordinator"), "durable-2",
                           {absl::StrCat("--state_dir=", state_dir)}));
  absl::StatusOr<v1::JobStatus> job = Client(second.address())->GetJob("kept");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job->round(), 1);
  EXPECT_THAT(job->reason(), HasSubstr("all 2 member(s) of round 1 succeeded"));

  // The state directory is locked by `second`: a third coordinator refuses.
  Child third;
  ASSERT_TRUE(third.Start({Runfile("server/gradsync-coordinator"),
                           "--listen=127.0.0.1:0",
                           absl::StrCat("--state_dir=", state_dir)},
                          /*capture=*/true));
  ASSERT_TRUE(WaitAll({&third}, kBound));
  EXPECT_EQ(third.exit_code(), 1);
  EXPECT_THAT(third.err(), HasSubstr("is in use by another coordinator (pid " +
                                     std::to_string(second.child().pid()) + ")"));
  ASSERT_TRUE(second.Stop());

  Child check;
  ASSERT_TRUE(check.Start({Runfile("server/gradsync-coordinator"),
                           absl::StrCat("--state_dir=", state_dir),
                           "--check_state"},
                          /*capture=*/true));
  ASSERT_TRUE(WaitAll({&check}, kBound));
  EXPECT_EQ(check.exit_code(), 0) << check.describe();
  EXPECT_THAT(check.out(), HasSubstr(": ok (state format 1,"));
  EXPECT_THAT(check.out(), HasSubstr(" 1 jobs,"));
}

}  // namespace
}  // namespace gradsync
