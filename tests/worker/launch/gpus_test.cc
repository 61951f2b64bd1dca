#include "worker/launch/gpus.h"

#include <map>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(GpusTest, ComputeAppsParseToBytesByPid) {
  // nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,
  // nounits: one line per process and GPU; values it cannot read are
  // "[N/A]".
  const std::map<pid_t, int64_t> bytes = ParseComputeApps(
      "4242, 1024\n"
      "4243, 512\n"
      "4242, 256\n"
      "4244, [N/A]\n"
      "\n"
      "garbage\n");
  const std::map<pid_t, int64_t> expected = {
      {4242, (1024 + 256) * (int64_t{1} << 20)},
      {4243, 512 * (int64_t{1} << 20)},
  };
  EXPECT_EQ(bytes, expected);
  EXPECT_TRUE(ParseComputeApps("").empty());
}

TEST(GpusTest, TheQueryIsReadFromTheCommandsOutput) {
  absl::StatusOr<std::map<pid_t, int64_t>> memory = GpuMemoryByPid(
      {"/bin/sh", "-c", "echo '12, 34'; echo '56, [N/A]'"}, absl::Seconds(30));
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(*memory, (std::map<pid_t, int64_t>{{12, int64_t{34} << 20}}));
  memory = GpuMemoryByPid({"/no/such/nvidia-smi"}, absl::Seconds(30));
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_TRUE(memory->empty());
}

TEST(GpusTest, AQueryThatHangsIsKilledAtItsTimeout) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::map<pid_t, int64_t>> memory =
      GpuMemoryByPid({"/bin/sleep", "60"}, absl::Milliseconds(200));
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kDeadlineExceeded)
      << memory.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "waited for it";
}

}  // namespace
}  // namespace gradsync
