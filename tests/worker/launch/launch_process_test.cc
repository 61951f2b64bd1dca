// `gradsync launch` with real processes on loopback: a PyTorch DDP script
// written for torchrun runs unchanged as 2 nodes x 2 processes and ends with
// the parameters torchrun's run of it ends with; the coordinator shows every
// rank while it runs; a failed process restarts the group within
// --max_restarts and fails the job with its exit code after; a stop signal
// (SIGINT, SIGTERM, SIGHUP, SIGQUIT) stops the processes.
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using testing::Child;
using testing::CoordinatorProcess;
using testing::PumpUntil;
using testing::Runfile;
using testing::TempPath;
using testing::WaitAll;

constexpr absl::Duration kBound = absl::Seconds(120);
constexpr char kPython[] = "/usr/bin/python3";

// Prints its rank and restart count; rank 1 exits 3 until restart `heals`.
std::string FlakyProgram(int heals) {
  return absl::StrCat(
      "echo \"rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT\"; "
      "if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" -lt ", heals,
      " ]; then exit 3; fi");
}

std::vector<double> ReadNumbers(const std::string& path) {
  std::vector<double> numbers;
  std::ifstream in(path);
  for (double v; in >> v;) numbers.push_back(v);
  return numbers;
}

class LaunchProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(coordinator_.Start(Runfile("server/gradsync-coordinator"),
                                   "launch"));
    ClientOptions options;
    options.target = coordinator_.address();
    client_ = *GrpcCoordinatorClient::Create(options);
  }
  void TearDown() override { EXPECT_TRUE(coordinator_.Stop()); }

  // Starts the agent of node `node` of `job` (nnodes nodes of nproc).
  std::unique_ptr<Child> Agent(const std::string& job, int node, int nnodes,
                               int nproc, const std::vector<std::string>& flags,
                               const std::vector<std::string>& program) {
    std::vector<std::string> argv = {
        Runfile("cli/gradsync"), "launch",
        "--coordinator=" + coordinator_.address(), "--rdzv_id=" + job,
        absl::StrCat("--nnodes=", nnodes),
        absl::StrCat("--nproc_per_node=", nproc),
        absl::StrCat("--node_id=node", node), "--python", kPython};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("--");
    argv.insert(argv.end(), program.begin(), program.end());
    auto child = std::make_unique<Child>();
    EXPECT_TRUE(child->Start(argv, /*capture=*/true));
    return child;
  }

  v1::JobStatus Job(const std::string& job) {
    absl::StatusOr<v1::JobStatus> status = client_->GetJob(job);
    return status.ok() ? *status : v1::JobStatus();
  }

  CoordinatorProcess coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
};

TEST_F(LaunchProcessTest, ATorchrunScriptEndsAsUnderTorchrun) {
  const std::string script = Runfile("tests/worker/launch/ddp_script.py");
  const std::string ours = TempPath("params-launch.txt");
  const std::string theirs = TempPath("params-torchrun.txt");
  // A pause per step keeps the script running while status is read.
  const std::vector<std::string> program = {script, ours, "--pause", "0.2"};
  std::unique_ptr<Child> a = Agent("torch", 0, 2, 2, {}, program);
  std::unique_ptr<Child> b = Agent("torch", 1, 2, 2, {}, program);

  // While it runs, the coordinator shows 4 ranks heartbeating, with the
  // memory and CPU time the agents sampled.
  auto all_beating = [&] {
    v1::JobStatus job = Job("torch");
    int beating = 0;
    for (const v1::Member& m : job.members()) {
      if (m.metrics().state() == v1::WORKER_STATE_TRAINING &&
          m.metrics().rss_bytes() > 0 && m.metrics().cpu_seconds() > 0) {
        ++beating;
      }
    }
    return beating == 4;
  };
  EXPECT_TRUE(PumpUntil({a.get(), b.get()}, kBound, all_beating))
      << a->describe() << b->describe();
  ASSERT_TRUE(WaitAll({a.get(), b.get()}, kBound));
  ASSERT_EQ(a->exit_code(), 0) << a->describe();
  ASSERT_EQ(b->exit_code(), 0) << b->describe();
  // Node ranks follow the order of the joins: either agent may run rank 0.
  EXPECT_THAT(a->out() + b->out(), HasSubstr("[rank0]: rank 0: wrote"));

  std::string status;
  Child cli;
  ASSERT_TRUE(cli.Start({Runfile("cli/gradsync"),
                         "--coordinator=" + coordinator_.address(), "status",
                         "torch"},
                        /*capture=*/true));
  ASSERT_TRUE(WaitAll({&cli}, kBound));
  EXPECT_THAT(cli.out(), HasSubstr("succeeded"));
  EXPECT_THAT(cli.out(), HasSubstr("world size  4 (nodes 2 x 2"));

  // The same script under torchrun, 4 processes. --standalone picks a free
  // port, closes it and binds it again later; on a machine running other
  // tests something else may take it meanwhile ("Address already in use",
  // seen in CI). That race is torchrun's, so it gets a second try.
  std::unique_ptr<Child> torchrun;
  for (int attempt = 1; attempt <= 2; ++attempt) {
    torchrun = std::make_unique<Child>();
    ASSERT_TRUE(torchrun->Start(
        {kPython, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node=4", "--redirects=1", "--tee=1",
         "--log_dir=" + TempPath(absl::StrCat("torchrun-logs-", attempt)),
         script, theirs},
        /*capture=*/true));
    ASSERT_TRUE(WaitAll({torchrun.get()}, kBound));
    if (torchrun->exit_code() == 0 ||
        torchrun->err().find("Address already in use") == std::string::npos) {
      break;
    }
  }
  ASSERT_EQ(torchrun->exit_code(), 0) << torchrun->describe();

  const std::vector<double> x = ReadNumbers(ours), y = ReadNumbers(theirs);
  ASSERT_EQ(x.size(), 610u);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(x[i], y[i], 1e-6) << "parameter " << i;
  }
}

TEST_F(LaunchProcessTest, AFailedProcessRestartsTheGroup) {
  const std::vector<std::string> program = {"/bin/sh", "-c", FlakyProgram(1)};
  std::unique_ptr<Child> a = Agent("flaky", 0, 2, 2, {"--max_restarts=2"}, program);
  std::unique_ptr<Child> b = Agent("flaky", 1, 2, 2, {"--max_restarts=2"}, program);
  ASSERT_TRUE(WaitAll({a.get(), b.get()}, kBound))
      << a->describe() << "\n" << b->describe();
  EXPECT_EQ(a->exit_code(), 0) << a->describe();
  EXPECT_EQ(b->exit_code(), 0) << b->describe();
  // Every rank ran again with the next restart count, in round 2, even
  // those whose first run had succeeded before rank 1 failed.
  const std::string out = a->out() + b->out();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("[rank", rank, "]: rank=", rank,
                                            " restart=1")));
  }
  EXPECT_THAT(a->err() + b->err(),
              ContainsRegex("rank 1 \\(pid [0-9]+\\) exited with code 3; "
                            "restarting the group \\(restart 1 of 2\\)"));
  const v1::JobStatus job = Job("flaky");
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();
  EXPECT_EQ(job.round(), 2);
  // The agent said how its process ended when it rejoined: the cause.
  ASSERT_EQ(job.recoveries_size(), 1);
  EXPECT_THAT(job.recoveries(0).cause(),
              MatchesRegex("rank 1 \\(pid [0-9]+\\) exited with code 3"));
  EXPECT_FALSE(job.recoveries(0).resumed_in_place());
}

TEST_F(LaunchProcessTest, SimulatedDevicesAreOfferedToTheRound) {
  // `--device=sim`: one process per simulated GPU, and a round that
  // negotiates NCCL for them as for CUDA devices.
  ASSERT_EQ(setenv("GRADSYNC_SIM_DEVICES", "2", 1), 0);
  std::unique_ptr<Child> a = Agent(
      "sim", 0, 1, 1, {"--device=sim", "--nproc_per_node=gpu", "--no_python"},
      {"/bin/sh", "-c", "echo \"rank=$RANK of $WORLD_SIZE\""});
  ASSERT_EQ(unsetenv("GRADSYNC_SIM_DEVICES"), 0);
  ASSERT_TRUE(WaitAll({a.get()}, kBound)) << a->describe();
  ASSERT_EQ(a->exit_code(), 0) << a->describe();
  EXPECT_THAT(a->out(), HasSubstr("[rank0]: rank=0 of 2"));
  EXPECT_THAT(a->out(), HasSubstr("[rank1]: rank=1 of 2"));
  const v1::JobStatus job = Job("sim");
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();
  EXPECT_EQ(job.backend(), v1::BACKEND_NCCL) << job.DebugString();
  ASSERT_EQ(job.members_size(), 2);
  for (const v1::Member& m : job.members()) {
    EXPECT_EQ(m.node().device_type(), v1::DEVICE_TYPE_SIM);
    EXPECT_EQ(m.node().device_count(), 2);
  }
}

TEST_F(LaunchProcessTest, RestartsRunOutAndTheJobFailsWithTheExitCode) {
  const std::vector<std::string> program = {"/bin/sh", "-c", FlakyProgram(9)};
  std::unique_ptr<Child> a = Agent("doomed", 0, 2, 2, {"--max_restarts=1"}, program);
  std::unique_ptr<Child> b = Agent("doomed", 1, 2, 2, {"--max_restarts=1"}, program);
  ASSERT_TRUE(WaitAll({a.get(), b.get()}, kBound));
  // Rank 1's agent exits with its code, the other with 1.
  Child* failed = absl::StrContains(a->out(), "[rank1]:") ? a.get() : b.get();
  Child* other = failed == a.get() ? b.get() : a.get();
  EXPECT_EQ(failed->exit_code(), 3) << failed->describe();
  EXPECT_EQ(other->exit_code(), 1) << other->describe();
  EXPECT_THAT(failed->err(), HasSubstr("no restarts left (--max_restarts=1)"));
  EXPECT_THAT(other->err(), HasSubstr("the job failed"));
  const v1::JobStatus job = Job("doomed");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.DebugString();
  EXPECT_EQ(job.round(), 2);
  EXPECT_THAT(job.reason(), HasSubstr("exit code 3"));
}

// gradsync's own trainer heals in place under the launcher: the agent joins
// for its processes, restarts only the one that died, which rejoins as a
// new incarnation and takes the lost rank; the others re-form without
// restarting and training resumes after the last committed step. On
// simulated GPUs (NCCL over them): each survivor keeps its device and the
// replacement takes the one the lost process left free.
TEST_F(LaunchProcessTest, GradsyncWorkerRestartsAloneAndTheOthersHealInPlace) {
  // Local process 1 dies right after committing its 15th step (only in its
  // first life: a restarted process has no LOCAL_RANK).
  const std::string worker = Runfile("worker/gradsync-worker");
  std::unique_ptr<Child> agent = Agent(
      "healing", 0, 1, 3, {"--max_restarts=1", "--self_managed"},
      {"/bin/sh", "-c",
       "if [ \"$LOCAL_RANK\" = 1 ]; then exec \"$0\" --failpoint=step:15 "
       "\"$@\"; else exec \"$0\" \"$@\"; fi",
       worker, "--device=sim", "--hidden=32", "--synthetic_size=2000",
       "--batch_size=16", "--steps=40", "--threads=1", "--log_every=0"});
  ASSERT_TRUE(WaitAll({agent.get()}, kBound));
  EXPECT_EQ(agent->exit_code(), 0) << agent->describe();
  const std::string out = agent->out() + agent->err();
  EXPECT_THAT(out, HasSubstr("[local1]: failpoint step hit"));
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("round 1: rank ", rank, " on sim:",
                                            rank)));
    EXPECT_THAT(out, HasSubstr(absl::StrCat("round 2: rank ", rank, " on sim:",
                                            rank)));
  }
  EXPECT_THAT(out, HasSubstr("restarting that process alone (restart 1 of 1)"));
  // The survivors re-formed in place (no restart of theirs) and resumed.
  EXPECT_THAT(out, HasSubstr("round 1 failed on rank 0 after step 15"));
  EXPECT_THAT(out, HasSubstr("round 2: rank 0 of 3, resuming after step 15"));
  const v1::JobStatus job = Job("healing");
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();
  EXPECT_EQ(job.round(), 2);
}

TEST_F(LaunchProcessTest, AGradsyncWorkerOutOfRestartsFailsTheJob) {
  std::unique_ptr<Child> agent = Agent(
      "unhealed", 0, 1, 2, {"--max_restarts=0", "--self_managed"},
      {"/bin/sh", "-c",
       "if [ \"$LOCAL_RANK\" = 1 ]; then exec \"$0\" --failpoint=step:3 "
       "\"$@\"; else exec \"$0\" \"$@\"; fi",
       Runfile("worker/gradsync-worker"), "--hidden=8", "--synthetic_size=500",
       "--batch_size=8", "--steps=200", "--threads=1", "--log_every=0"});
  ASSERT_TRUE(WaitAll({agent.get()}, kBound));
  EXPECT_EQ(agent->exit_code(), 86) << agent->describe();  // the failpoint's
  EXPECT_THAT(agent->err(), HasSubstr("no restarts left (--max_restarts=0)"));
  const v1::JobStatus job = Job("unhealed");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.DebugString();
  EXPECT_THAT(job.reason(), HasSubstr("exit code 86"));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// --redirects sends a stream only to the rank's log file, --tee to both;
// per local rank ("0:2") as torchrun's.
TEST_F(LaunchProcessTest, LogDirKeepsEachRanksStreams) {
  const std::string logs = TempPath("logs");
  std::unique_ptr<Child> agent = Agent(
      "logged", 0, 1, 2,
      {"--log_dir=" + logs, "--redirects=1", "--tee=0:2"},
      {"/bin/sh", "-c", "echo out-$RANK; echo err-$RANK >&2"});
  ASSERT_TRUE(WaitAll({agent.get()}, kBound));
  ASSERT_EQ(agent->exit_code(), 0) << agent->describe();
  EXPECT_EQ(ReadFile(logs + "/attempt_0/rank0/stdout.log"), "out-0\n");
  EXPECT_EQ(ReadFile(logs + "/attempt_0/rank1/stdout.log"), "out-1\n");
  EXPECT_THAT(agent->out(), Not(HasSubstr("out-")));  // redirected
  EXPECT_EQ(ReadFile(logs + "/attempt_0/rank0/stderr.log"), "err-0\n");
  EXPECT_THAT(agent->err(), HasSubstr("[rank0]: err-0"));  // teed
  EXPECT_THAT(agent->err(), HasSubstr("[rank1]: err-1"));  // console only
  EXPECT_EQ(ReadFile(logs + "/attempt_0/rank1/stderr.log"), "");
}

// Sets `signal`'s disposition in this process to `handler` (children
// started meanwhile inherit it) and restores it when it goes out of scope.
class ScopedDisposition {
 public:
  ScopedDisposition(int signal, sighandler_t handler)
      : signal_(signal), previous_(std::signal(signal, handler)) {}
  ~ScopedDisposition() { std::signal(signal_, previous_); }
  ScopedDisposition(const ScopedDisposition&) = delete;
  ScopedDisposition& operator=(const ScopedDisposition&) = delete;

 private:
  const int signal_;
  const sighandler_t previous_;
};

// Stopping an agent with a signal; parameterized over torchrun's stop
// signals: SIGINT, SIGTERM, and SIGHUP and SIGQUIT (the terminal or the ssh
// session went away).
class LaunchStopTest : public LaunchProcessTest,
                       public ::testing::WithParamInterface<int> {
 protected:
  // Starts an agent of `job` on 1 node whose 2 processes record their pids
  // in `pids` and wait (in their shells' groups); returns once both run.
  std::unique_ptr<Child> Sleepers(const std::string& job,
                                  const std::string& pids) {
    std::unique_ptr<Child> agent = Agent(
        job, 0, 1, 2, {"--stop_timeout=20"},
        {"/bin/sh", "-c", absl::StrCat("echo $$ >> ", pids, "; sleep 60")});
    auto both_running = [&] {
      std::ifstream in(pids);
      int lines = 0;
      for (std::string line; std::getline(in, line);) ++lines;
      return lines == 2;
    };
    EXPECT_TRUE(PumpUntil({agent.get()}, kBound, both_running))
        << agent->describe();
    return agent;
  }
};

TEST_P(LaunchStopTest, AStopSignalStopsTheProcessesAndFailsTheJob) {
  const int signal = GetParam();
  const std::string job = absl::StrCat("stopped-", signal);
  const std::string pids = TempPath(absl::StrCat("pids-", signal));
  std::unique_ptr<Child> agent;
  {
    // Not ignored when the agent starts (see AHangupUnderNohupIsIgnored).
    ScopedDisposition by_default(signal, SIG_DFL);
    agent = Sleepers(job, pids);
  }
  ASSERT_FALSE(HasFailure());
  agent->Signal(signal);
  ASSERT_TRUE(WaitAll({agent.get()}, kBound));
  EXPECT_EQ(agent->exit_code(), 128 + signal) << agent->describe();
  std::ifstream in(pids);
  for (int pid; in >> pid;) {
    EXPECT_NE(kill(pid, 0), 0) << "process " << pid << " still runs";
  }
  const v1::JobStatus status = Job(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED) << status.DebugString();
  EXPECT_THAT(status.reason(),
              HasSubstr(absl::StrCat("stopped by signal ", signal)));
}

INSTANTIATE_TEST_SUITE_P(TorchrunsStopSignals, LaunchStopTest,
                         ::testing::Values(SIGINT, SIGTERM, SIGHUP, SIGQUIT),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("SIG", sigabbrev_np(info.param));
                         });

// Started under nohup (SIGHUP ignored), the agent keeps ignoring a hangup,
// and so do its processes; the SIGTERM sent after it is what stops them.
TEST_F(LaunchStopTest, AHangupUnderNohupIsIgnored) {
  const std::string pids = TempPath("pids-nohup");
  std::unique_ptr<Child> agent;
  {
    ScopedDisposition nohup(SIGHUP, SIG_IGN);
    agent = Sleepers("nohup", pids);
  }
  ASSERT_FALSE(HasFailure());
  agent->Signal(SIGHUP);
  agent->Signal(SIGTERM);
  ASSERT_TRUE(WaitAll({agent.get()}, kBound));
  EXPECT_EQ(agent->exit_code(), 128 + SIGTERM) << agent->describe();
}

// The agent wakes a thread of its own with SIGUSR1; one sent from outside
// neither kills it nor keeps it from hearing the stop sent after it.
TEST_F(LaunchStopTest, ASigusr1FromOutsideChangesNothing) {
  const std::string pids = TempPath("pids-usr1");
  std::unique_ptr<Child> agent = Sleepers("usr1", pids);
  ASSERT_FALSE(HasFailure());
  agent->Signal(SIGUSR1);
  agent->Signal(SIGTERM);
  ASSERT_TRUE(WaitAll({agent.get()}, kBound)) << agent->describe();
  EXPECT_EQ(agent->exit_code(), 128 + SIGTERM) << agent->describe();
}

}  // namespace
}  // namespace gradsync
