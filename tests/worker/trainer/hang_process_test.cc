// A real hang with real processes: one of three gradsync-workers stands
// still before a step's first collective while its heartbeats go on
// (--failpoint=hang:STEP), over shared memory, Gloo TCP and the simulated
// GPU (NCCL). The coordinator's self-set hang timeout (10 x the p99 of a
// few-millisecond step, raised to its 1 s minimum) names the hung rank in
// status within 2 s; the peers' collective watchdogs (here at least 4 s,
// far below the fixed --timeout of 60 s) abort their round, the round
// re-forms with all three and the job succeeds. Before that, the stacks the
// verdict asked for show in status: the hung rank's training thread waiting
// in the failpoint, which no peer's thread is. And the other side: a job of
// 10 s steps (--step_sleep), its ranks apart by 2 s, is never diagnosed hung.
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::PumpUntil;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::WaitAll;
using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(120);
// Late enough that the heartbeats (every 250 ms, each bringing the step
// time of a new step) brought the coordinator 8 step times, when its hang
// timeout sets itself: steps take at least 2 ms (--step_sleep), so the
// hang comes 1.2 s or more into the round. (Without the sleep a step took
// 0.7 ms on an idle machine, and the hang came before the timeout had set
// itself: the peers' 4 s watchdogs ended the round inside the fixed 30 s.)
constexpr int kHangStep = 600;

// Three gradsync-workers of job "hang" with a coordinator of their own.
class HangJobTest : public ::testing::Test {
 protected:
  static std::string Job() { return "hang"; }

  void SetUp() override {
    // Heartbeats every 250 ms: the coordinator hears of the last progress
    // within that; 12 missed (3 s) before a rank counts as lost, so that a
    // loaded machine does not lose one.
    ASSERT_TRUE(coordinator_.Start(
        Runfile("server/gradsync-coordinator"), "hang_process_test",
        {"--heartbeat_interval=250ms", "--missed_heartbeats=12"}));
    ClientOptions options;
    options.target = coordinator_.address();
    client_ = *GrpcCoordinatorClient::Create(options);
  }
  void TearDown() override { EXPECT_TRUE(coordinator_.Stop()); }

  // Worker `index` of three, training `steps` steps, with `extra` flags.
  std::unique_ptr<Child> StartWorker(int index, int steps,
                                     const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {
        Runfile("worker/gradsync-worker"),
        absl::StrCat("--coordinator=", coordinator_.address()),
        "--job=" + Job(), "--nnodes=3",
        absl::StrCat("--node_id=n", index), "--model=mlp",
        "--hidden=24", "--dataset=synthetic", "--synthetic_size=96",
        "--batch_size=4", absl::StrCat("--steps=", steps), "--threads=1",
        "--log_every=0", "--timeout=60s", "--join_timeout=60s"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto child = std::make_unique<Child>();
    EXPECT_TRUE(child->Start(argv, /*capture=*/true));
    return child;
  }

  v1::JobStatus Status() {
    absl::StatusOr<v1::JobStatus> status = client_->GetJob(Job());
    return status.ok() ? *status : v1::JobStatus();
  }

  CoordinatorProcess coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
};

// Over the transport GetParam() names.
class HangProcessTest : public HangJobTest,
                        public ::testing::WithParamInterface<std::string> {
 protected:
  std::unique_ptr<Child> StartWorker(int index, bool hangs) {
    std::vector<std::string> extra = {GetParam(), "--min_collective_timeout=4s",
                                      "--step_sleep=2ms"};
    if (hangs) extra.push_back(absl::StrCat("--failpoint=hang:", kHangStep));
    return HangJobTest::StartWorker(index, 1200, extra);
  }
};

TEST_P(HangProcessTest, AHangIsNamedWithinTwoSecondsAndHealed) {
  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(StartWorker(i, i == 1));
  std::vector<Child*> children;
  for (auto& w : workers) children.push_back(w.get());
  Child& hung = *workers[1];
  ASSERT_TRUE(PumpUntil(children, kBound, [&] {
    return absl::StrContains(hung.err(), "failpoint hang hit at step") ||
           !hung.running();
  }));
  ASSERT_TRUE(hung.running()) << hung.describe();
  const absl::Time hit = absl::Now();
  // Its rank in round 1, from "rank R of 3 (node ...), round 1,".
  const std::string& out = hung.out();
  const size_t at = out.find("rank ");
  ASSERT_NE(at, std::string::npos) << hung.describe();
  const std::string rank = out.substr(at + 5, 1);

  v1::JobStatus status;
  absl::Time named = hit + kBound;
  while (absl::Now() < hit + absl::Seconds(30)) {
    status = Status();
    if (!status.diagnosis().hang().empty()) {
      named = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LE(named - hit, absl::Seconds(2)) << status.DebugString();
  std::cout << "hang named in status " << absl::FormatDuration(named - hit)
            << " after the hung rank stood still\n";
  EXPECT_THAT(status.diagnosis().hang(),
              HasSubstr(absl::StrCat("rank ", rank, " finished #")));
  EXPECT_TRUE(status.diagnosis().hang_timeout_self_set());
  EXPECT_EQ(status.diagnosis().hang_timeout().seconds(), 1);

  // The verdict asked the hung rank for its threads' stacks, and a peer
  // for contrast; they answer with their next heartbeat, long before the
  // peers' watchdogs (4 s) end the round. The hung rank's training thread
  // stands in the wait for the round's end: a stack only it has.
  const auto answered = [&](const v1::JobStatus& s) {
    const auto& ranks = s.diagnosis().hang_stacks().answered();
    return ranks.size() == 2;
  };
  while (!answered(status) && status.round() < 2 &&
         absl::Now() < hit + absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(20));
    status = Status();
  }
  const v1::HangStacks& stacks = status.diagnosis().hang_stacks();
  ASSERT_TRUE(answered(status)) << status.DebugString();
  EXPECT_EQ(absl::StrCat(stacks.hung_ranks(0)), rank);
  EXPECT_NE(absl::StrCat(stacks.healthy_rank()), rank);
  bool found = false;
  for (const v1::StackGroup& g : stacks.groups()) {
    const std::string frames = absl::StrJoin(g.frames(), "\n");
    if (!absl::StrContains(frames, "HealthReporter::AwaitRoundOver")) continue;
    found = true;
    EXPECT_TRUE(g.hung_only()) << frames;
    std::cout << "the hung rank's training thread, as status shows it:\n"
              << frames << "\n";
  }
  EXPECT_TRUE(found) << stacks.DebugString();
  // `gradsync status` shows them.
  Child cli;
  ASSERT_TRUE(cli.Start({Runfile("cli/gradsync"),
                         "--coordinator=" + coordinator_.address(), "status",
                         Job()},
                        /*capture=*/true));
  ASSERT_TRUE(WaitAll({&cli}, kBound));
  std::cout << "gradsync status:\n" << cli.out();
  EXPECT_THAT(cli.out(),
              HasSubstr(absl::StrCat("\nstacks (asked rank ", rank, " behind")));
  EXPECT_THAT(cli.out(), HasSubstr("1 thread (gradsync-worker), behind only:\n"));
  EXPECT_THAT(cli.out(), HasSubstr("      gradsync::HealthReporter::AwaitRoundOver()\n"));

  // The peers' watchdogs (4 s) end the round, far inside the backends'
  // fixed 60 s.
  ASSERT_TRUE(PumpUntil(children, kBound, [&] {
    return Status().round() == 2 || !hung.running();
  }));
  const absl::Duration healed = absl::Now() - hit;
  std::cout << "round 2 formed " << absl::FormatDuration(healed)
            << " after the hung rank stood still\n";
  EXPECT_LT(healed, absl::Seconds(30));
  ASSERT_TRUE(WaitAll(children, kBound));
  // The first peer whose watchdog fires aborts its process group, which
  // fails the other's collectives too.
  int fired = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    EXPECT_EQ(workers[i]->exit_code(), 0) << workers[i]->describe();
    fired += absl::StrContains(
        workers[i]->err(), "longer than the self-set collective timeout of 4s");
  }
  EXPECT_GE(fired, 1) << workers[0]->describe() << workers[2]->describe();
  EXPECT_THAT(hung.err(),
              HasSubstr(absl::StrCat("stood still before step ", kHangStep,
                                     " until the coordinator ended the "
                                     "round")));
  status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 2);
  EXPECT_EQ(status.world_size(), 3);
  EXPECT_EQ(status.recoveries_size(), 1);
}

INSTANTIATE_TEST_SUITE_P(Transports, HangProcessTest,
                         ::testing::Values("--shared_memory=true",
                                           "--shared_memory=false",
                                           "--device=sim"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           if (info.param == "--device=sim") return "SimulatedGpu";
                           return info.param == "--shared_memory=true"
                                      ? "SharedMemory"
                                      : "Gloo";
                         });

// The other side of a self-set timeout: a job whose steps take 10 s is
// never diagnosed hung. Ranks 0 and 1 compute 8 s a step and rank 2 10 s
// (--step_sleep, over shared memory), so every step the first two wait 2 s
// in a collective that rank 2 has not started: the positions a hang
// verdict looks for, 10 s after the last collective finished. Until 8 step
// times arrived the coordinator waits its fixed 30 s; from the third step
// on (three ranks' samples) 10 x their 99th percentile, at least 100 s. A
// timeout set from the collectives (milliseconds, raised to its 1 s
// minimum) instead would call every step's wait a hang. Status is read
// every 100 ms for the whole run; the job succeeds in its first round.
TEST_F(HangJobTest, TenSecondStepsAreNeverDiagnosedAHang) {
  constexpr int kSteps = 4;
  std::vector<std::unique_ptr<Child>> workers;
  std::vector<Child*> children;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(
        StartWorker(i, kSteps,
                    {"--shared_memory=true",
                     i == 2 ? "--step_sleep=10s" : "--step_sleep=8s"}));
    children.push_back(workers.back().get());
  }
  std::string hang;
  absl::Duration self_set_timeout;
  int64_t last_step = 0;
  int64_t steps_after_self_set = 0;
  absl::Time next_read = absl::Now();
  ASSERT_TRUE(PumpUntil(children, kBound, [&] {
    if (absl::Now() >= next_read) {
      next_read = absl::Now() + absl::Milliseconds(100);
      const v1::JobStatus status = Status();
      if (hang.empty()) hang = status.diagnosis().hang();
      const int64_t step = status.summary().max_step();
      if (status.diagnosis().hang_timeout_self_set()) {
        self_set_timeout =
            absl::Seconds(status.diagnosis().hang_timeout().seconds());
        if (step > last_step) ++steps_after_self_set;
      }
      last_step = std::max(last_step, step);
    }
    for (Child* c : children) {
      if (c->running()) return false;
    }
    return true;
  }));
  ASSERT_TRUE(WaitAll(children, kBound));
  for (auto& w : workers) EXPECT_EQ(w->exit_code(), 0) << w->describe();
  EXPECT_EQ(hang, "") << "a job of 10 s steps was diagnosed hung";
  EXPECT_GE(self_set_timeout, absl::Seconds(100));
  std::cout << "self-set hang timeout with 10 s steps: "
            << absl::FormatDuration(self_set_timeout) << "; " << last_step
            << " steps, " << steps_after_self_set
            << " of them seen ending under it\n";
  EXPECT_GE(steps_after_self_set, 1);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 1);
  EXPECT_EQ(status.recoveries_size(), 0);
}

}  // namespace
}  // namespace gradsync
