#include "common/process_usage.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(ProcessUsageTest, ThisProcessUsesMemoryAndGrowsWithWhatItTouches) {
  const int64_t before = ResidentBytes(0);
  EXPECT_GT(before, 0);
  EXPECT_GT(ResidentBytes(getpid()), 0);
  std::vector<char> touched(64 << 20, 1);  // 64 MiB, every page written
  EXPECT_GE(ResidentBytes(0), before + (48 << 20)) << touched[12345];
}

TEST(ProcessUsageTest, CpuTimeCountsWorkDone) {
  const double before = CpuSeconds(0);
  // Burn about 200 ms of CPU (bounded by the wall clock, not by a count).
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  volatile uint64_t sink = 0;
  while (std::chrono::steady_clock::now() < end) sink = sink + 1;
  EXPECT_GT(CpuSeconds(0), before);
  EXPECT_GT(CpuSeconds(getpid()), 0.0);
}

TEST(ProcessUsageTest, AProcessThatIsGoneReadsZero) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(ResidentBytes(child), 0);
  EXPECT_EQ(CpuSeconds(child), 0.0);
}

}  // namespace
}  // namespace gradsync
