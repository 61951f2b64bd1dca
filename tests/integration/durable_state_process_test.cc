// gradsync-coordinator with durable state, --state_dir (SQLite) or --etcd
// (a real etcd-server started by the test): a job keeps training through a
// kill -9 of the coordinator and a restart on the same address and state, a
// rendezvous in progress forms, a worker that died meanwhile is found, and
// keys and results are kept; a second coordinator on a state directory in
// use is refused at start with a clear error.
#include <signal.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::EtcdProcess;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::TempPath;
using ::gradsync::testing::WaitAll;
using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(60);

std::unique_ptr<CoordinatorClient> Client(const std::string& address) {
  ClientOptions options;
  options.target = address;
  return *GrpcCoordinatorClient::Create(options);
}

// Starts simulated worker `index` of the `world` of `job`, training `steps`
// steps of `step_time`.
std::unique_ptr<Child> StartWorker(const std::string& address,
                                   const std::string& job, int world,
                                   int index, int steps,
                                   absl::Duration step_time) {
  auto worker = std::make_unique<Child>();
  EXPECT_TRUE(worker->Start(
      {Runfile("worker/gradsync-sim-worker"),
       absl::StrCat("--coordinator=", address), absl::StrCat("--job=", job),
       absl::StrCat("--nnodes=", world), absl::StrCat("--node_id=node-", index),
       "--last_call_timeout=0s", absl::StrCat("--train_steps=", steps),
       absl::StrCat("--step_time=", absl::FormatDuration(step_time))},
      /*capture=*/true));
  return worker;
}

// Starts `world` simulated workers of `job` that train for `steps` steps.
std::vector<std::unique_ptr<Child>> StartWorkers(
    const std::string& address, const std::string& job, int world, int steps,
    absl::Duration step_time = absl::Milliseconds(20)) {
  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < world; ++i) {
    workers.push_back(StartWorker(address, job, world, i, steps, step_time));
  }
  return workers;
}

// Polls `job` on `client` until `done` holds for it (true) or kBound passes.
bool JobReaches(CoordinatorClient* client, const std::string& job,
                const std::function<bool(const v1::JobStatus&)>& done) {
  const absl::Time deadline = absl::Now() + kBound;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::JobStatus> status = client->GetJob(job);
    if (status.ok() && done(*status)) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// While `holder` serves from `state_dir`, a second coordinator on it exits
// 1 naming the holder; once `holder` has stopped, --check_state finds the
// state sound with its one job.
void ExpectLockedThenSound(const std::string& state_dir,
                           CoordinatorProcess* holder) {
  Child third;
  ASSERT_TRUE(third.Start({Runfile("server/gradsync-coordinator"),
                           "--listen=127.0.0.1:0",
                           absl::StrCat("--state_dir=", state_dir)},
                          /*capture=*/true));
  ASSERT_TRUE(WaitAll({&third}, kBound));
  EXPECT_EQ(third.exit_code(), 1);
  EXPECT_THAT(third.err(), HasSubstr("is in use by another coordinator (pid " +
                                     std::to_string(holder->child().pid()) + ")"));
  ASSERT_TRUE(holder->Stop());

  Child check;
  ASSERT_TRUE(check.Start({Runfile("server/gradsync-coordinator"),
                           absl::StrCat("--state_dir=", state_dir),
                           "--check_state"},
                          /*capture=*/true));
  ASSERT_TRUE(WaitAll({&check}, kBound));
  EXPECT_EQ(check.exit_code(), 0) << check.describe();
  EXPECT_THAT(check.out(), HasSubstr(": ok (state format 2,"));
  EXPECT_THAT(check.out(), HasSubstr(" 1 jobs,"));
}

enum class Backend { kStateDir, kEtcd };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kStateDir ? "StateDir" : "Etcd";
}

// Each test's coordinators keep their state in the backend of the
// parameter: a directory of their own, or a namespace of their own in an
// etcd started for the test.
class DurableStateProcessTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() != Backend::kEtcd) return;
    if (EtcdProcess::Binary().empty()) {
      GTEST_SKIP() << "no etcd binary: install etcd-server";
    }
    ASSERT_TRUE(etcd_.Start("process-test"));
  }

  // The flags that point a coordinator at the state named `name`.
  std::vector<std::string> StateFlags(const std::string& name) const {
    if (GetParam() == Backend::kStateDir) {
      return {absl::StrCat("--state_dir=", TempPath(absl::StrCat("state-", name)))};
    }
    return {absl::StrCat("--etcd=", etcd_.endpoint()),
            absl::StrCat("--etcd_prefix=/", name, "/")};
  }

  // Starts a coordinator on the state named `state`.
  ::testing::AssertionResult StartOn(CoordinatorProcess* coordinator,
                                     const std::string& state,
                                     const std::string& name) {
    return coordinator->Start(Runfile("server/gradsync-coordinator"), name,
                              StateFlags(state));
  }

  // kill -9 of `first`, then a coordinator on its address and `state`.
  ::testing::AssertionResult KillAndRestart(CoordinatorProcess* first,
                                            CoordinatorProcess* second,
                                            const std::string& state,
                                            const std::string& name) {
    first->child().Signal(SIGKILL);
    if (!WaitAll({&first->child()}, kBound)) {
      return ::testing::AssertionFailure() << "the killed coordinator lingers";
    }
    std::vector<std::string> flags = StateFlags(state);
    flags.push_back(absl::StrCat("--listen=", first->address()));
    return second->Start(Runfile("server/gradsync-coordinator"), name, flags);
  }

  EtcdProcess etcd_;
};

INSTANTIATE_TEST_SUITE_P(Backends, DurableStateProcessTest,
                         ::testing::Values(Backend::kStateDir, Backend::kEtcd),
                         BackendName);

TEST_P(DurableStateProcessTest, TrainingGoesOnThroughKillNineAndRestart) {
  const std::string state = "mid-training";
  CoordinatorProcess first;
  ASSERT_TRUE(StartOn(&first, state, "mid-1"));
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
  // The job shows RUNNING once its round is recorded, a moment before the
  // round's key-value store opens (its workers are answered after both):
  // until then a write is FAILED_PRECONDITION "no closed round yet".
  absl::Status set;
  for (int i = 0; i < 200; ++i) {  // at most 10 s
    set = client->Set(scope, "set-before-the-crash", "kept");
    if (set.code() != absl::StatusCode::kFailedPrecondition) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(set.ok()) << set;

  CoordinatorProcess second;  // the same port and state
  ASSERT_TRUE(KillAndRestart(&first, &second, state, "mid-2"));
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

TEST_P(DurableStateProcessTest, RoundFormsThroughARestartDuringTheRendezvous) {
  const std::string state = "rendezvous";
  CoordinatorProcess first;
  ASSERT_TRUE(StartOn(&first, state, "rdzv-1"));
  std::unique_ptr<Child> early = StartWorker(first.address(), "forming", 2, 0,
                                             5, absl::Milliseconds(20));
  ASSERT_TRUE(JobReaches(Client(first.address()).get(), "forming",
                         [](const v1::JobStatus& job) {
                           return job.waiting_size() == 1;
                         }));
  // The early worker's join is in flight when the coordinator dies; it is
  // retried, waits again, and the round forms once the second worker joins.
  CoordinatorProcess second;
  ASSERT_TRUE(KillAndRestart(&first, &second, state, "rdzv-2"));
  std::unique_ptr<Child> late = StartWorker(second.address(), "forming", 2, 1,
                                            5, absl::Milliseconds(20));
  ASSERT_TRUE(WaitAll({early.get(), late.get()}, kBound));
  EXPECT_EQ(early->exit_code(), 0) << early->describe();
  EXPECT_EQ(late->exit_code(), 0) << late->describe();
  absl::StatusOr<v1::JobStatus> job = Client(second.address())->GetJob("forming");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
  EXPECT_EQ(job->round(), 1);
  ASSERT_TRUE(second.Stop());
}

TEST_P(DurableStateProcessTest, WorkerDeadDuringTheOutageIsLostAfterTheGrace) {
  const std::string state = "grace";
  CoordinatorProcess first;
  ASSERT_TRUE(StartOn(&first, state, "grace-1"));
  std::vector<std::unique_ptr<Child>> workers = StartWorkers(
      first.address(), "outage", 2, 100000, absl::Milliseconds(100));
  // Both train and heartbeat.
  v1::JobStatus training;
  ASSERT_TRUE(JobReaches(Client(first.address()).get(), "outage",
                         [&](const v1::JobStatus& job) {
                           training = job;
                           return job.members_size() == 2 &&
                                  job.members(0).metrics().step() > 0 &&
                                  job.members(1).metrics().step() > 0;
                         }));
  const bool first_is_rank1 =
      workers[0]->pid() == training.members(1).node().pid();
  Child* rank1 = workers[first_is_rank1 ? 0 : 1].get();
  Child* rank0 = workers[first_is_rank1 ? 1 : 0].get();
  first.child().Signal(SIGKILL);
  ASSERT_TRUE(WaitAll({&first.child()}, kBound));
  // Rank 1's process dies while nobody watches: its stream cannot break on
  // the new coordinator, only its silence can tell.
  rank1->Signal(SIGKILL);
  ASSERT_TRUE(WaitAll({rank1}, kBound));
  CoordinatorProcess second;
  std::vector<std::string> flags = StateFlags(state);
  flags.push_back(absl::StrCat("--listen=", first.address()));
  // Heartbeats every 0.5 s: a grace of 5 x 3 x 0.5 s keeps the test short.
  flags.push_back("--heartbeat_interval=500ms");
  ASSERT_TRUE(second.Start(Runfile("server/gradsync-coordinator"), "grace-2",
                           flags));
  const absl::Time restarted = absl::Now();
  v1::JobStatus seen;
  ASSERT_TRUE(JobReaches(Client(second.address()).get(), "outage",
                         [&](const v1::JobStatus& job) {
                           seen = job;
                           return job.members_size() == 2 &&
                                  job.members(1).state() ==
                                      v1::MEMBER_STATE_LOST;
                         }));
  const absl::Duration took = absl::Now() - restarted;
  std::printf("rank 1 shown LOST %s after the restart\n",
              absl::FormatDuration(took).c_str());
  // Not before the grace of five detection windows (5 x 3 x 0.5 s), within
  // which rank 0 reconnected.
  EXPECT_GE(took, absl::Milliseconds(7400));
  EXPECT_LE(took, absl::Seconds(25));
  EXPECT_THAT(seen.members(1).state_reason(), HasSubstr("since the coordinator restarted"));
  EXPECT_EQ(seen.members(0).state(), v1::MEMBER_STATE_ACTIVE);
  rank0->Signal(SIGKILL);
  ASSERT_TRUE(WaitAll({rank0}, kBound));
  ASSERT_TRUE(second.Stop());
}

TEST_P(DurableStateProcessTest, AJobsResultIsKeptThroughKillNineAndRestart) {
  const std::string state = "kill-nine";
  CoordinatorProcess first;
  ASSERT_TRUE(StartOn(&first, state, "durable-1"));
  std::vector<std::unique_ptr<Child>> workers =
      StartWorkers(first.address(), "kept", 2, 5);
  ASSERT_TRUE(WaitAll({workers[0].get(), workers[1].get()}, kBound));
  for (auto& worker : workers) ASSERT_EQ(worker->exit_code(), 0) << worker->describe();

  first.child().Signal(SIGKILL);
  ASSERT_TRUE(WaitAll({&first.child()}, kBound));

  CoordinatorProcess second;
  ASSERT_TRUE(StartOn(&second, state, "durable-2"));
  absl::StatusOr<v1::JobStatus> job = Client(second.address())->GetJob("kept");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job->round(), 1);
  EXPECT_THAT(job->reason(), HasSubstr("all 2 member(s) of round 1 succeeded"));

  if (GetParam() == Backend::kStateDir) {
    ExpectLockedThenSound(TempPath("state-kill-nine"), &second);
  } else {
    ASSERT_TRUE(second.Stop());
  }
}

}  // namespace
}  // namespace gradsync
