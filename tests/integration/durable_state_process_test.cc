// gradsync-coordinator --state_dir: a job's result is kept through a kill -9
// and a restart on the same state; a second coordinator on a state directory
// in use is refused at start with a clear error.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

TEST(DurableStateProcessTest, AJobsResultIsKeptThroughKillNineAndRestart) {
  const std::string state_dir = TempPath("state-kill-nine");
  CoordinatorProcess first;
  ASSERT_TRUE(first.Start(Runfile("server/gradsync-coordinator"), "durable-1",
                          {absl::StrCat("--state_dir=", state_dir)}));
  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<Child>());
    ASSERT_TRUE(workers.back()->Start(
        {Runfile("worker/gradsync-sim-worker"),
         absl::StrCat("--coordinator=", first.address()), "--job=kept",
         "--nnodes=2", absl::StrCat("--node_id=node-", i),
         "--last_call_timeout=0s", "--train_steps=5", "--step_time=10ms"},
        /*capture=*/true));
  }
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
