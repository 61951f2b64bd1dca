#include "worker/launch/torchrun_env.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/runtime/thread_stacks.h"

namespace gradsync {
namespace {

using ::testing::Contains;
using ::testing::Not;
using ::testing::StartsWith;

TEST(TorchrunEnvTest, VariablesFollowTheAssignment) {
  v1::Assignment a;
  a.set_job_id("run7");
  a.set_round(3);
  a.set_rank(5);
  a.set_local_rank(1);
  a.set_world_size(8);
  a.set_local_world_size(4);
  a.set_node_rank(1);
  a.set_num_nodes(2);
  a.set_backend(v1::BACKEND_GLOO);
  AgentContext c;
  c.role = "trainer";
  c.coordinator = "10.0.0.5:29400";
  c.master_addr = "10.0.0.7";
  c.master_port = 41000;
  c.restart_count = 2;
  c.max_restarts = 3;
  const std::map<std::string, std::string> expected = {
      {"RANK", "5"},
      {"LOCAL_RANK", "1"},
      {"WORLD_SIZE", "8"},
      {"LOCAL_WORLD_SIZE", "4"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"ROLE_RANK", "5"},
      {"ROLE_WORLD_SIZE", "8"},
      {"ROLE_NAME", "trainer"},
      {"MASTER_ADDR", "10.0.0.7"},
      {"MASTER_PORT", "41000"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"},
      {"TORCHELASTIC_RUN_ID", "run7"},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"GRADSYNC_COORDINATOR", "10.0.0.5:29400"},
      {"GRADSYNC_JOB", "run7"},
      {"GRADSYNC_ROUND", "3"},
      {"GRADSYNC_BACKEND", "gloo"},
  };
  EXPECT_EQ(TorchrunVariables(a, c), expected);
}

TEST(TorchrunEnvTest, TheAgentsSocketAndStacksFileWhenItHasThem) {
  v1::Assignment a;
  a.set_local_rank(3);
  AgentContext c;
  c.agent_socket = "/tmp/agent-x/metrics.sock";
  c.stacks_dir = "/tmp/agent-x";
  std::map<std::string, std::string> v = TorchrunVariables(a, c);
  EXPECT_EQ(v["GRADSYNC_AGENT_SOCKET"], "/tmp/agent-x/metrics.sock");
  EXPECT_EQ(v["GRADSYNC_STACKS_FILE"], "/tmp/agent-x/stacks-3");
  EXPECT_EQ(v["GRADSYNC_STACKS_SIGNAL"], std::to_string(ThreadStackSignal()));
  v = TorchrunVariables(a, AgentContext());
  EXPECT_EQ(v.count("GRADSYNC_AGENT_SOCKET"), 0u);
  EXPECT_EQ(v.count("GRADSYNC_STACKS_FILE"), 0u);
  EXPECT_EQ(v.count("GRADSYNC_STACKS_SIGNAL"), 0u);
}

TEST(TorchrunEnvTest, MergeSetsOverTheBaseAndDefaultsThreadsAndMalloc) {
  const std::vector<std::string> merged = MergeEnvironment(
      {"PATH=/bin", "RANK=99", "MALFORMED"}, {{"RANK", "0"}}, 2);
  EXPECT_THAT(merged, Contains("PATH=/bin"));
  EXPECT_THAT(merged, Contains("RANK=0"));
  EXPECT_THAT(merged, Not(Contains("RANK=99")));
  EXPECT_THAT(merged, Contains("OMP_NUM_THREADS=1"));
  EXPECT_THAT(merged, Contains("MALLOC_MMAP_THRESHOLD_=33554432"));
  EXPECT_THAT(merged, Contains("MALLOC_TRIM_THRESHOLD_=1073741824"));
  // Values the user set are kept.
  const std::vector<std::string> mine = MergeEnvironment(
      {"OMP_NUM_THREADS=8", "MALLOC_TRIM_THRESHOLD_=0"}, {}, 2);
  EXPECT_THAT(mine, Contains("OMP_NUM_THREADS=8"));
  EXPECT_THAT(mine, Contains("MALLOC_TRIM_THRESHOLD_=0"));
}

// As torchrun (run.py): one OpenMP thread per process only when several
// processes share the node; a node's only process keeps OpenMP's default.
TEST(TorchrunEnvTest, OneOmpThreadOnlyWhenSeveralProcessesShareTheNode) {
  EXPECT_THAT(MergeEnvironment({}, {}, 2), Contains("OMP_NUM_THREADS=1"));
  EXPECT_THAT(MergeEnvironment({"PATH=/bin"}, {}, 1),
              Not(Contains(StartsWith("OMP_NUM_THREADS="))));
  EXPECT_THAT(MergeEnvironment({"OMP_NUM_THREADS=4"}, {}, 1),
              Contains("OMP_NUM_THREADS=4"));
}

// As torchrun (torch 2.x's local_elastic_agent): ProcessGroupNCCL's watchdog
// tears a process down on an NCCL error or timeout unless the user says
// otherwise, so a hung collective ends in a restart instead of a hang.
TEST(TorchrunEnvTest, NcclAsyncErrorHandlingIsOnUnlessSet) {
  EXPECT_THAT(MergeEnvironment({}, {}, 1),
              Contains("TORCH_NCCL_ASYNC_ERROR_HANDLING=1"));
  const std::vector<std::string> mine =
      MergeEnvironment({"TORCH_NCCL_ASYNC_ERROR_HANDLING=3"}, {}, 1);
  EXPECT_THAT(mine, Contains("TORCH_NCCL_ASYNC_ERROR_HANDLING=3"));
  EXPECT_THAT(mine, Not(Contains("TORCH_NCCL_ASYNC_ERROR_HANDLING=1")));
}

// The Python package unpacked beside the command (PREFIX/bin/gradsync,
// PREFIX/lib/python3/dist-packages/gradsync) is found; /usr's is on
// Python's path already, and a prefix without it gives nothing.
TEST(PythonPathTest, FindsThePackageInstalledBesideTheCommand) {
  namespace fs = std::filesystem;
  const fs::path prefix = testing::TempPath("python_path_prefix");
  fs::create_directories(prefix / "bin");
  const std::string exe = (prefix / "bin" / "gradsync").string();
  std::ofstream(exe) << "";
  EXPECT_EQ(PackagedPythonPath(exe), "");  // no package there yet
  const fs::path folder = prefix / "lib" / "python3" / "dist-packages";
  fs::create_directories(folder / "gradsync");
  std::ofstream((folder / "gradsync" / "__init__.py").string()) << "";
  EXPECT_EQ(PackagedPythonPath(exe), folder.string());
  EXPECT_EQ(PackagedPythonPath("/usr/bin/gradsync"), "");
}

TEST(PythonPathTest, AppendsAfterTheUsersOwnEntriesOnce) {
  EXPECT_THAT(WithPythonPath({"HOME=/root"}, "/opt/g/lib"),
              Contains("PYTHONPATH=/opt/g/lib"));
  EXPECT_THAT(WithPythonPath({"PYTHONPATH=/mine"}, "/opt/g/lib"),
              Contains("PYTHONPATH=/mine:/opt/g/lib"));
  EXPECT_THAT(WithPythonPath({"PYTHONPATH=/opt/g/lib:/mine"}, "/opt/g/lib"),
              Contains("PYTHONPATH=/opt/g/lib:/mine"));
  EXPECT_THAT(WithPythonPath({"PYTHONPATH="}, "/opt/g/lib"),
              Contains("PYTHONPATH=/opt/g/lib"));
  const std::vector<std::string> unchanged = {"PYTHONPATH=/mine"};
  EXPECT_EQ(WithPythonPath(unchanged, ""), unchanged);
}

}  // namespace
}  // namespace gradsync
