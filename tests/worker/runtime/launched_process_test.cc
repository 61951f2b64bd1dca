#include "worker/runtime/launched_process.h"

#include <stdlib.h>
#include <unistd.h>

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Sets `variables` in this process's environment for one test.
class Environment {
 public:
  explicit Environment(const std::map<std::string, std::string>& variables) {
    Clear();
    for (const auto& [name, value] : variables) {
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~Environment() { Clear(); }

 private:
  static void Clear() {
    for (const char* name : {"GRADSYNC_COORDINATOR", "GRADSYNC_JOIN_REQUEST",
                             "GRADSYNC_ASSIGNMENT"}) {
      unsetenv(name);
    }
  }
};

v1::JoinRequest Request() {
  v1::JoinRequest request;
  request.set_job_id("train");
  request.mutable_config()->set_nproc_per_node(4);
  request.mutable_node()->set_node_id("node-a");
  request.mutable_node()->set_incarnation_id("inc-1");
  request.mutable_node()->set_pid(1);
  return request;
}

TEST(LaunchedProcessTest, NotLaunchedIsNullopt) {
  Environment env({});
  absl::StatusOr<std::optional<LaunchedProcess>> launched =
      LaunchedProcessFromEnvironment();
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_FALSE(launched->has_value());
}

TEST(LaunchedProcessTest, WhatTheAgentSetsIsWhatTheProcessReads) {
  v1::Assignment assignment;
  assignment.set_job_id("train");
  assignment.set_round(3);
  assignment.set_rank(5);
  Environment env(LaunchedProcessVariables("10.0.0.5:29400", Request(),
                                           &assignment));
  absl::StatusOr<std::optional<LaunchedProcess>> launched =
      LaunchedProcessFromEnvironment();
  ASSERT_TRUE(launched.ok()) << launched.status();
  ASSERT_TRUE(launched->has_value());
  const LaunchedProcess& p = **launched;
  EXPECT_EQ(p.coordinator, "10.0.0.5:29400");
  EXPECT_EQ(p.request.node().incarnation_id(), "inc-1");
  EXPECT_EQ(p.request.config().nproc_per_node(), 4);
  EXPECT_EQ(p.request.node().pid(), getpid());  // the process's own
  ASSERT_TRUE(p.assignment.has_value());
  EXPECT_EQ(p.assignment->rank(), 5);
  EXPECT_EQ(p.assignment->round(), 3);
}

TEST(LaunchedProcessTest, ARestartedProcessHasNoAssignment) {
  Environment env(LaunchedProcessVariables("h:1", Request(), nullptr));
  absl::StatusOr<std::optional<LaunchedProcess>> launched =
      LaunchedProcessFromEnvironment();
  ASSERT_TRUE(launched.ok()) << launched.status();
  ASSERT_TRUE(launched->has_value());
  EXPECT_FALSE((*launched)->assignment.has_value());
}

TEST(LaunchedProcessTest, GarbageIsInvalidArgument) {
  Environment env({{"GRADSYNC_COORDINATOR", "h:1"},
                   {"GRADSYNC_JOIN_REQUEST", "!!not base64!!"}});
  absl::StatusOr<std::optional<LaunchedProcess>> launched =
      LaunchedProcessFromEnvironment();
  ASSERT_FALSE(launched.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(launched.status()));
  EXPECT_THAT(std::string(launched.status().message()),
              HasSubstr("GRADSYNC_JOIN_REQUEST is not a base64"));
}

}  // namespace
}  // namespace gradsync
