// SelfManagedAgent against a fake coordinator: a failed process is
// restarted alone, as a new incarnation asking for the local slot it left
// free; out of restarts, the agent joins in its place to report the failure.
// The processes are real (/bin/sh scripts).
#include "worker/launch/self_managed_agent.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::MatchesRegex;

constexpr char kJob[] = "self-managed-job";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class SelfManagedAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    out_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                        "/self_managed_agent_test.", getpid(), ".", ++counter_);
    ASSERT_EQ(system(absl::StrCat("mkdir -p ", out_).c_str()), 0);
    options_.coordinator = "127.0.0.1:29400";
    options_.job = kJob;
    options_.nproc_per_node = 2;
    options_.self_managed = true;
    options_.monitor_interval = absl::Milliseconds(50);
    options_.stop_timeout = absl::Seconds(5);
  }

  int RunAgent(const std::string& script) {
    options_.command = {"/bin/sh", "-c", script};
    SelfManagedAgent agent(options_, &fake_,
                           {"PATH=/usr/bin:/bin", absl::StrCat("OUT=", out_)});
    return agent.Run();
  }

  static inline int counter_ = 0;
  std::string out_;
  LaunchOptions options_;
  FakeCoordinatorClient fake_;
};

TEST_F(SelfManagedAgentTest, AFailedProcessIsRestartedAloneInItsLocalSlot) {
  options_.max_restarts = 1;
  // Local 1 fails at first; its replacement records the join request it
  // was handed; local 0 ends once the replacement has run (at most 30 s).
  const std::string script =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ]; then "
      "  echo \"$GRADSYNC_JOIN_REQUEST\" > \"$OUT/replacement.tmp\"; "
      "  echo \"$GRADSYNC_ASSIGNMENT\" > \"$OUT/assignment\"; "
      "  mv \"$OUT/replacement.tmp\" \"$OUT/replacement\"; exit 0; "
      "fi; "
      "echo \"$GRADSYNC_JOIN_REQUEST\" > \"$OUT/first$LOCAL_RANK\"; "
      "[ \"$LOCAL_RANK\" = 1 ] && exit 3; "
      "i=0; while [ ! -e \"$OUT/replacement\" ] && [ $i -lt 600 ]; do "
      "  sleep 0.05; i=$((i+1)); done; exit 0";
  EXPECT_EQ(RunAgent(script), 0);
  // One join, for the node's first round: the replacement joins by itself.
  EXPECT_EQ(fake_.node_joins().size(), 1u);
  v1::JoinRequest first, replacement;
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(
      absl::StripAsciiWhitespace(ReadFile(out_ + "/first1")), &bytes));
  ASSERT_TRUE(first.ParseFromString(bytes));
  ASSERT_TRUE(absl::Base64Unescape(
      absl::StripAsciiWhitespace(ReadFile(out_ + "/replacement")), &bytes));
  ASSERT_TRUE(replacement.ParseFromString(bytes));
  EXPECT_NE(replacement.node().incarnation_id(), first.node().incarnation_id());
  EXPECT_EQ(replacement.local_slot(), 1);  // the slot it left free
  EXPECT_EQ(absl::StripAsciiWhitespace(ReadFile(out_ + "/assignment")), "");
  EXPECT_TRUE(fake_.completions().empty());  // the processes report
}

TEST_F(SelfManagedAgentTest, OutOfRestartsTheAgentReportsTheFailure) {
  EXPECT_EQ(RunAgent("[ \"$LOCAL_RANK\" = 1 ] && exit 3; exec sleep 30"), 3);
  // It joined in the failed process's place, as a new incarnation ...
  const std::vector<v1::JoinRequest> joins = fake_.joins();
  ASSERT_EQ(joins.size(), 1u);
  const std::vector<v1::JoinNodeRequest> node_joins = fake_.node_joins();
  ASSERT_EQ(node_joins.size(), 1u);
  for (const v1::ProcessJoin& process : node_joins[0].processes()) {
    EXPECT_NE(joins[0].node().incarnation_id(),
              process.node().incarnation_id());
  }
  // ... only to report the failure, with the process's exit code.
  const std::vector<v1::ReportCompletionRequest> reports = fake_.completions();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_FALSE(reports[0].success());
  EXPECT_EQ(reports[0].exit_code(), 3);
  EXPECT_THAT(reports[0].message(),
              MatchesRegex("rank 1 \\(pid [0-9]+\\) exited with code 3"));
  EXPECT_EQ(reports[0].member().incarnation_id(),
            joins[0].node().incarnation_id());
  EXPECT_EQ(fake_.GetJob(kJob, false)->state(), v1::JOB_STATE_FAILED);
}

TEST_F(SelfManagedAgentTest, AStopEndsTheProcesses) {
  options_.command = {"/bin/sh", "-c",
                      "touch \"$OUT/started$LOCAL_RANK\"; exec sleep 30"};
  SelfManagedAgent agent(options_, &fake_,
                         {"PATH=/usr/bin:/bin", absl::StrCat("OUT=", out_)});
  std::thread stopper([&] {
    for (int i = 0; i < 600; ++i) {  // at most 30 s
      if (access((out_ + "/started0").c_str(), F_OK) == 0 &&
          access((out_ + "/started1").c_str(), F_OK) == 0) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    agent.RequestStop(SIGTERM);
  });
  const absl::Time start = absl::Now();
  EXPECT_EQ(agent.Run(), 128 + SIGTERM);
  stopper.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(25));
  EXPECT_TRUE(fake_.completions().empty());
}

}  // namespace
}  // namespace gradsync
