// NodeAgent (torchrun's contract) against a fake coordinator: the group's
// joins, restarts and their causes, the exit barrier, stops, the master's
// address through the store, and what is reported. The processes are real
// (/bin/sh scripts), the coordinator is FakeCoordinatorClient.
#include "worker/launch/node_agent.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr char kJob[] = "agent-job";
// Each process writes what it was told to $OUT/rank<RANK>.<RESTART>.
constexpr char kRecord[] =
    "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT\" "
    "> \"$OUT/rank$RANK.$TORCHELASTIC_RESTART_COUNT\"";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class NodeAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    out_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/node_agent_test.",
                        getpid(), ".", ++counter_);
    ASSERT_EQ(system(absl::StrCat("mkdir -p ", out_).c_str()), 0);
    options_.coordinator = "127.0.0.1:29400";
    options_.job = kJob;
    options_.nproc_per_node = 2;
    options_.monitor_interval = absl::Milliseconds(50);
    options_.stop_timeout = absl::Seconds(5);
  }

  // Runs the agent over `script` (sh -c) to its exit code.
  int RunAgent(const std::string& script) {
    options_.command = {"/bin/sh", "-c", script};
    NodeAgent agent(options_, &fake_, Environment());
    return agent.Run();
  }
  std::vector<std::string> Environment() const {
    return {"PATH=/usr/bin:/bin", absl::StrCat("OUT=", out_)};
  }
  std::string Record(int rank, int restart) const {
    return ReadFile(absl::StrCat(out_, "/rank", rank, ".", restart));
  }
  // Waits until both ranks of round `round` were heard from.
  bool AwaitHeartbeats(int64_t round) {
    return fake_.AwaitCondition(
        [round](const FakeCoordinatorClient& fake) {
          std::set<int> ranks;
          for (const v1::HeartbeatRequest& h : fake.heartbeats()) {
            if (h.member().round() == round) ranks.insert(h.member().rank());
          }
          return ranks.size() == 2;
        },
        absl::Seconds(30));
  }

  static inline int counter_ = 0;
  std::string out_;
  LaunchOptions options_;
  FakeCoordinatorClient fake_;
};

TEST_F(NodeAgentTest, EveryProcessSucceedingSucceedsTheJob) {
  EXPECT_EQ(RunAgent(kRecord), 0);
  // Node rank 0 published its address and port for the others.
  v1::Scope scope;
  scope.set_job_id(kJob);
  scope.set_round(1);
  absl::StatusOr<std::string> master = fake_.Get(scope, "launch/master");
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_EQ(Record(0, 0), absl::StrCat("0 2 0 ", *master, "\n"));
  EXPECT_EQ(Record(1, 0), absl::StrCat("1 2 1 ", *master, "\n"));
  ASSERT_EQ(fake_.completions().size(), 2u);
  for (const v1::ReportCompletionRequest& report : fake_.completions()) {
    EXPECT_TRUE(report.success());
    EXPECT_EQ(report.member().round(), 1);
  }
  EXPECT_EQ(fake_.node_joins().size(), 1u);
  EXPECT_EQ(fake_.GetJob(kJob, false)->state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(NodeAgentTest, AFailedProcessRestartsTheGroupWithItsCause) {
  options_.max_restarts = 1;
  const std::string script = absl::StrCat(
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
      "  [ \"$RANK\" = 1 ] && exit 3; exec sleep 30; "
      "fi; ",
      kRecord);
  EXPECT_EQ(RunAgent(script), 0);
  const std::vector<v1::JoinNodeRequest> joins = fake_.node_joins();
  ASSERT_EQ(joins.size(), 2u);
  EXPECT_EQ(joins[0].rejoin_reason(), "");
  EXPECT_THAT(joins[1].rejoin_reason(),
              MatchesRegex("rank 1 \\(pid [0-9]+\\) exited with code 3"));
  for (const v1::ProcessJoin& process : joins[1].processes()) {
    EXPECT_EQ(process.last_round(), 1);
  }
  // The same incarnations rejoin: torchrun's group restart.
  EXPECT_EQ(joins[1].processes(0).node().incarnation_id(),
            joins[0].processes(0).node().incarnation_id());
  EXPECT_THAT(Record(0, 1), HasSubstr("0 2 0"));
  EXPECT_THAT(Record(1, 1), HasSubstr("1 2 1"));
}

TEST_F(NodeAgentTest, ItLeavesNothingInItsTemporaryDirectory) {
  // The agent's socket and each process's stacks file live in a directory
  // under $TMPDIR; every attempt's files go with the agent (a restart too).
  // Under /tmp: a socket's path must fit in 108 bytes, a sandbox's may not.
  char made[] = "/tmp/node_agent_test.XXXXXX";
  ASSERT_NE(mkdtemp(made), nullptr);
  const std::string tmp = made;
  const char* before = std::getenv("TMPDIR");
  const std::string saved = before != nullptr ? before : "";
  ASSERT_EQ(setenv("TMPDIR", tmp.c_str(), 1), 0);
  options_.max_restarts = 1;
  const int code = RunAgent(
      "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ] && exit 3; "
      "test -f \"$GRADSYNC_STACKS_FILE\"");
  if (before != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  EXPECT_EQ(code, 0);  // each process found its stacks file
  EXPECT_EQ(fake_.node_joins().size(), 2u);
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(tmp)) {
    left.push_back(entry.path().string());
  }
  EXPECT_THAT(left, ::testing::IsEmpty());
  std::filesystem::remove_all(tmp);
}

TEST_F(NodeAgentTest, OutOfRestartsTheFailureIsReportedWithItsExitCode) {
  EXPECT_EQ(RunAgent("[ \"$RANK\" = 1 ] && exit 3; exec sleep 30"), 3);
  const std::vector<v1::ReportCompletionRequest> reports = fake_.completions();
  ASSERT_EQ(reports.size(), 1u);  // the other rank only stops heartbeating
  EXPECT_EQ(reports[0].member().rank(), 1);
  EXPECT_FALSE(reports[0].success());
  EXPECT_EQ(reports[0].exit_code(), 3);
  EXPECT_THAT(reports[0].message(), HasSubstr("exited with code 3"));
  EXPECT_EQ(fake_.node_joins().size(), 1u);
}

TEST_F(NodeAgentTest, AStopEndsTheProcessesAndIsReported) {
  options_.command = {"/bin/sh", "-c", "exec sleep 30"};
  NodeAgent agent(options_, &fake_, Environment());
  std::thread stopper([&] {
    if (AwaitHeartbeats(1)) agent.RequestStop(SIGTERM);
  });
  const absl::Time start = absl::Now();
  EXPECT_EQ(agent.Run(), 128 + SIGTERM);
  stopper.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(25));  // not the sleep's end
  const std::vector<v1::ReportCompletionRequest> reports = fake_.completions();
  ASSERT_EQ(reports.size(), 2u);
  for (const v1::ReportCompletionRequest& report : reports) {
    EXPECT_FALSE(report.success());
    EXPECT_EQ(report.exit_code(), 128 + SIGTERM);
    EXPECT_EQ(report.message(), "stopped by signal 15");
  }
}

TEST_F(NodeAgentTest, AStopWhileJoiningLeavesTheRendezvous) {
  fake_.HoldJoins();
  options_.command = {"/bin/sh", "-c", "exit 0"};
  NodeAgent agent(options_, &fake_, Environment());
  std::thread stopper([&] {
    if (fake_.AwaitCondition(
            [](const FakeCoordinatorClient& f) { return f.waiting_joins() == 1; },
            absl::Seconds(30))) {
      agent.RequestStop(SIGINT);
    }
  });
  EXPECT_EQ(agent.Run(), 128 + SIGINT);
  stopper.join();
  const auto leaves = fake_.leaves();
  const std::vector<v1::JoinNodeRequest> joins = fake_.node_joins();
  ASSERT_EQ(leaves.size(), 2u);
  ASSERT_EQ(joins.size(), 1u);
  EXPECT_EQ(leaves[0].second, joins[0].processes(0).node().incarnation_id());
  EXPECT_TRUE(fake_.completions().empty());
}

TEST_F(NodeAgentTest, TheCoordinatorEndingTheRoundRestartsTheGroup) {
  options_.max_restarts = 1;
  const std::string script = absl::StrCat(
      "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exec sleep 30; ", kRecord);
  options_.command = {"/bin/sh", "-c", script};
  NodeAgent agent(options_, &fake_, Environment());
  std::thread superseder([&] {
    if (AwaitHeartbeats(1)) {
      fake_.EndMembers(absl::AbortedError("round 1 was superseded"));
    }
  });
  EXPECT_EQ(agent.Run(), 0);
  superseder.join();
  const std::vector<v1::JoinNodeRequest> joins = fake_.node_joins();
  ASSERT_EQ(joins.size(), 2u);
  EXPECT_EQ(joins[1].rejoin_reason(), "");  // not this node's process
  EXPECT_EQ(joins[1].processes(0).last_round(), 1);
  EXPECT_THAT(Record(1, 1), HasSubstr("1 2 1"));
}

TEST_F(NodeAgentTest, AFailedJobIsNotRestarted) {
  options_.max_restarts = 3;
  options_.command = {"/bin/sh", "-c", "exec sleep 30"};
  NodeAgent agent(options_, &fake_, Environment());
  std::thread failer([&] {
    if (AwaitHeartbeats(1)) {
      fake_.EndMembers(absl::FailedPreconditionError("the job failed"));
    }
  });
  EXPECT_EQ(agent.Run(), 1);
  failer.join();
  EXPECT_EQ(fake_.node_joins().size(), 1u);
}

// Two nodes of two processes: this agent is node rank 1.
absl::StatusOr<std::vector<v1::Assignment>> SecondNode(
    const v1::JoinNodeRequest& request, int64_t round) {
  std::vector<v1::Assignment> assignments;
  for (int i = 0; i < request.processes_size(); ++i) {
    v1::Assignment a;
    a.set_job_id(request.job_id());
    a.set_round(round);
    a.set_rank(2 + i);
    a.set_local_rank(i);
    a.set_world_size(4);
    a.set_local_world_size(2);
    a.set_node_rank(1);
    a.set_num_nodes(2);
    a.set_backend(v1::BACKEND_GLOO);
    assignments.push_back(a);
  }
  return assignments;
}

// Node rank 1 waits for node rank 0's master address (up to the join
// timeout); a stop meanwhile ends the wait at once, and no process starts.
TEST_F(NodeAgentTest, AStopWhileWaitingForNodeRankZeroStartsNothing) {
  fake_.SetNodeAssigner(SecondNode);  // no master in the store
  options_.join_timeout = absl::Minutes(5);
  options_.command = {"/bin/sh", "-c", kRecord};
  NodeAgent agent(options_, &fake_, Environment());
  std::thread stopper([&] {
    if (fake_.AwaitCondition(
            [](const FakeCoordinatorClient& f) {
              return f.node_joins().size() == 1;
            },
            absl::Seconds(30))) {
      agent.RequestStop(SIGTERM);
    }
  });
  const absl::Time start = absl::Now();
  EXPECT_EQ(agent.Run(), 128 + SIGTERM);
  stopper.join();
  EXPECT_LT(absl::Now() - start, absl::Minutes(1)) << "waited for the master";
  EXPECT_EQ(Record(2, 0), "") << "a process started";
  EXPECT_EQ(Record(3, 0), "") << "a process started";
  // The members say so in the round they joined.
  const std::vector<v1::ReportCompletionRequest> reports = fake_.completions();
  ASSERT_EQ(reports.size(), 2u);
  for (const v1::ReportCompletionRequest& report : reports) {
    EXPECT_EQ(report.member().round(), 1);
    EXPECT_FALSE(report.success());
    EXPECT_EQ(report.exit_code(), 128 + SIGTERM);
  }
}

// This agent as node rank 1 of two, with node rank 0's address in the
// store; once this node's processes reported, `other_node` changes the job
// as node rank 0's would (on a thread of its own, joined by the destructor).
class SecondNodeTest : public NodeAgentTest {
 protected:
  void SetUp() override {
    NodeAgentTest::SetUp();
    fake_.SetNodeAssigner(SecondNode);
    v1::Scope scope;
    scope.set_job_id(kJob);
    scope.set_round(1);
    ASSERT_TRUE(fake_.Set(scope, "launch/master", "10.1.2.3 4567").ok());
  }
  void TearDown() override {
    if (other_node_.joinable()) other_node_.join();
  }
  void AfterThisNodeReported(v1::JobState state, const std::string& reason) {
    other_node_ = std::thread([this, state, reason] {
      if (!fake_.AwaitCondition(
              [](const FakeCoordinatorClient& f) {
                return f.completions().size() == 2;
              },
              absl::Seconds(30))) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(200));  // the agent polls meanwhile
      v1::JobStatus job = *fake_.GetJob(kJob, false);
      job.set_state(state);
      job.set_reason(reason);
      fake_.SetJob(job);
    });
  }

  std::thread other_node_;
};

TEST_F(SecondNodeTest, ItReadsTheMasterFromTheStore) {
  AfterThisNodeReported(v1::JOB_STATE_SUCCEEDED, "");
  EXPECT_EQ(RunAgent(kRecord), 0);
  EXPECT_EQ(Record(2, 0), "2 4 0 10.1.2.3 4567\n");
  EXPECT_EQ(Record(3, 0), "3 4 1 10.1.2.3 4567\n");
}

// The round is superseded before this node starts its processes (a
// process of the other node failed at once): reading the master fails with
// ABORTED, and the agent rejoins with the group instead of giving up.
TEST_F(SecondNodeTest, ARoundSupersededBeforeItsProcessesStartIsRejoined) {
  options_.max_restarts = 1;
  v1::Scope round2;
  round2.set_job_id(kJob);
  round2.set_round(2);
  ASSERT_TRUE(fake_.Set(round2, "launch/master", "10.1.2.3 4567").ok());
  fake_.FailNext("Wait", absl::AbortedError(
                             "round 1 of job 'agent-job' is over: rejoin"));
  AfterThisNodeReported(v1::JOB_STATE_SUCCEEDED, "");
  EXPECT_EQ(RunAgent(kRecord), 0);
  EXPECT_EQ(fake_.node_joins().size(), 2u);
  EXPECT_EQ(Record(2, 1), "2 4 0 10.1.2.3 4567\n");  // restart 1
}

// The exit barrier: this node's processes are done, a process of the other
// node then fails the job.
TEST_F(SecondNodeTest, AFailureOfTheOtherNodeAfterThisOnesSuccessEndsIt) {
  AfterThisNodeReported(v1::JOB_STATE_FAILED, "rank 0 exited with code 9");
  EXPECT_EQ(RunAgent("exit 0"), 1);
  EXPECT_EQ(fake_.node_joins().size(), 1u);
}

}  // namespace
}  // namespace gradsync
