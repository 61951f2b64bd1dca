#include "worker/launch/launch_options.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(LaunchOptionsTest, ATorchrunCommandLineParses) {
  absl::StatusOr<LaunchOptions> o = ParseLaunchArgs(
      {"--nnodes=1:4", "--nproc-per-node", "2", "--rdzv_backend=c10d",
       "--rdzv_endpoint=10.0.0.5:29400", "--rdzv_id", "run7",
       "--max_restarts=3", "--monitor_interval=0.5", "--role=trainer",
       "--log_dir=/tmp/logs", "--redirects=3", "--tee=1", "train.py", "--lr",
       "0.1"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator, "10.0.0.5:29400");
  EXPECT_EQ(o->job, "run7");
  EXPECT_EQ(o->nnodes, "1:4");
  EXPECT_EQ(o->nproc_per_node, 2);
  EXPECT_EQ(o->max_restarts, 3);
  EXPECT_EQ(o->monitor_interval, absl::Milliseconds(500));
  EXPECT_EQ(o->role, "trainer");
  EXPECT_EQ(o->log_dir, "/tmp/logs");
  EXPECT_EQ(o->redirects.For(0), StdStreams::kAll);
  EXPECT_EQ(o->redirects.For(5), StdStreams::kAll);
  EXPECT_EQ(o->tee.For(1), StdStreams::kOut);
  // A script runs under Python, unbuffered, as torchrun runs it; the
  // script's own flags are left alone.
  EXPECT_THAT(o->command,
              ElementsAre("python3", "-u", "train.py", "--lr", "0.1"));
}

TEST(LaunchOptionsTest, ProgramsRunDirectlyOrAsModules) {
  absl::StatusOr<LaunchOptions> direct = ParseLaunchArgs(
      {"--coordinator=h:1", "--job=j", "--", "/bin/gradsync-worker", "--x"});
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_THAT(direct->command, ElementsAre("/bin/gradsync-worker", "--x"));

  absl::StatusOr<LaunchOptions> module = ParseLaunchArgs(
      {"--coordinator=h:1", "--job=j", "--python=/usr/bin/python3", "-m",
       "pkg.train"});
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_THAT(module->command,
              ElementsAre("/usr/bin/python3", "-u", "-m", "pkg.train"));

  absl::StatusOr<LaunchOptions> no_python = ParseLaunchArgs(
      {"--coordinator=h:1", "--job=j", "--no_python", "tool.py"});
  ASSERT_TRUE(no_python.ok()) << no_python.status();
  EXPECT_THAT(no_python->command, ElementsAre("tool.py"));
}

TEST(LaunchOptionsTest, StreamsMayBeSetPerLocalRank) {
  absl::StatusOr<LaunchOptions> o = ParseLaunchArgs(
      {"--coordinator=h:1", "--job=j", "--log_dir=/tmp/l", "--tee=0:1,2:3",
       "x"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->tee.For(0), StdStreams::kOut);
  EXPECT_EQ(o->tee.For(1), StdStreams::kNone);  // not named
  EXPECT_EQ(o->tee.For(2), StdStreams::kAll);
  EXPECT_TRUE(o->tee.Includes(2, 2));
  EXPECT_FALSE(o->tee.Includes(0, 2));
}

TEST(LaunchOptionsTest, NprocPerNodeCpuCountsTheCores) {
  absl::StatusOr<LaunchOptions> o = ParseLaunchArgs(
      {"--coordinator=h:1", "--job=j", "--nproc_per_node=cpu", "x"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_GE(o->nproc_per_node, 1);
}

TEST(LaunchOptionsTest, NprocPerNodeGpuCountsSimulatedDevicesWithDeviceSim) {
  ASSERT_EQ(setenv("GRADSYNC_SIM_DEVICES", "3", 1), 0);
  // --device may come after --nproc_per_node.
  absl::StatusOr<LaunchOptions> o =
      ParseLaunchArgs({"--coordinator=h:1", "--job=j", "--nproc_per_node=gpu",
                       "--device=sim", "x"});
  ASSERT_EQ(unsetenv("GRADSYNC_SIM_DEVICES"), 0);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, LaunchDevice::kSim);
  EXPECT_EQ(o->nproc_per_node, 3);
  o = ParseLaunchArgs({"--coordinator=h:1", "--job=j", "--device", "sim",
                       "--nproc_per_node=auto", "x"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nproc_per_node, 8);  // GRADSYNC_SIM_DEVICES' default
  o = ParseLaunchArgs({"--coordinator=h:1", "--job=j", "--device=cpu",
                       "--nproc_per_node=2", "x"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, LaunchDevice::kCpu);
  EXPECT_EQ(o->nproc_per_node, 2);
}

TEST(LaunchOptionsTest, BadCommandLinesNameTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--job=j", "x"}, "--coordinator: required"},
      {{"--coordinator=h:1", "x"}, "--job: required"},
      {{"--coordinator=h:1", "--job=j"}, "no program to run"},
      {{"--coordinator=h:1", "--job=j", "--nproc_per_node=0", "x"},
       "--nproc_per_node: '0' is not an integer >= 1"},
      {{"--coordinator=h:1", "--job=j", "--device=tpu", "x"},
       "--device: 'tpu' is not auto, cpu or sim"},
      {{"--coordinator=h:1", "--job=j", "--device=cpu", "--nproc_per_node=gpu",
        "x"},
       "--nproc_per_node: 'gpu' with --device=cpu"},
      {{"--coordinator=h:1", "--job=j", "--tee=0:1,x:2", "x"},
       "--tee: 'x:2' is not LOCAL_RANK:VALUE"},
      {{"--coordinator=h:1", "--job=j", "--redirects=0:4", "x"},
       "--redirects: '4' is not 0 (none)"},
      {{"--coordinator=h:1", "--job=j", "--max_restarts"}, "needs a value"},
      {{"--coordinator=h:1", "--job=j", "--monitor_interval=soon", "x"},
       "'soon' is not a duration"},
      {{"--coordinator=h:1", "--job=j", "--frobnicate=1", "x"},
       "unknown flag '--frobnicate=1'"},
      {{"--standalone", "x"}, "always rendezvouses through a coordinator"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<LaunchOptions> o = ParseLaunchArgs(c.args);
    ASSERT_FALSE(o.ok()) << c.error;
    EXPECT_TRUE(absl::IsInvalidArgument(o.status())) << o.status();
    EXPECT_THAT(std::string(o.status().message()), HasSubstr(c.error));
  }
}

}  // namespace
}  // namespace gradsync
