#include "server/memory_available.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

constexpr char kMeminfo[] =
    "MemTotal:       25165824 kB\nMemFree:         1000000 kB\n";
constexpr int64_t kMachine = int64_t{25165824} * 1024;  // 24 GiB

// A directory standing for "/", with the files a test writes under it.
class FakeRoot : public testing::Test {
 protected:
  void SetUp() override {
    std::string dir = testing::TempDir() + "memory-available-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    root_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void Write(const std::string& path, const std::string& contents) {
    const std::filesystem::path file = root_ / path;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << contents;
  }
  MemoryAvailable Available() {
    absl::StatusOr<MemoryAvailable> available =
        MemoryAvailableToThisProcess(root_.string());
    EXPECT_TRUE(available.ok()) << available.status();
    return available.value_or(MemoryAvailable{});
  }

  std::filesystem::path root_;
};

TEST_F(FakeRoot, WithoutCgroupLimitsItIsTheMachinesMemory) {
  Write("proc/meminfo", kMeminfo);
  Write("proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  Write("sys/fs/cgroup/user.slice/memory.max", "max\n");
  EXPECT_EQ(Available().bytes, kMachine);
  EXPECT_EQ(Available().source, "the machine's memory");
}

TEST_F(FakeRoot, TheSmallestLimitOnTheCgroupPathCounts) {
  Write("proc/meminfo", kMeminfo);
  Write("proc/self/cgroup", "0::/system.slice/gradsync.service\n");
  Write("sys/fs/cgroup/system.slice/memory.max", "4294967296\n");
  Write("sys/fs/cgroup/system.slice/gradsync.service/memory.max", "max\n");
  EXPECT_EQ(Available().bytes, int64_t{4} << 30);
  EXPECT_EQ(Available().source, "cgroup /system.slice's memory.max");

  Write("sys/fs/cgroup/system.slice/gradsync.service/memory.max",
        "1073741824\n");
  EXPECT_EQ(Available().bytes, int64_t{1} << 30);
}

TEST_F(FakeRoot, AContainersNamespacedRootCgroupCounts) {
  Write("proc/meminfo", kMeminfo);
  Write("proc/self/cgroup", "0::/\n");
  Write("sys/fs/cgroup/memory.max", "2147483648\n");
  EXPECT_EQ(Available().bytes, int64_t{2} << 30);
}

TEST_F(FakeRoot, CgroupV1sMemoryControllerIsRead) {
  Write("proc/meminfo", kMeminfo);
  Write("proc/self/cgroup",
        "12:cpu,cpuacct:/kubepods/pod1\n"
        "5:memory:/kubepods/pod1\n"
        "0::/\n");
  // v1's "no limit" is a page-rounded INT64_MAX: above the machine.
  Write("sys/fs/cgroup/memory/kubepods/memory.limit_in_bytes",
        "9223372036854771712\n");
  Write("sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes",
        "536870912\n");
  EXPECT_EQ(Available().bytes, int64_t{512} << 20);
  EXPECT_EQ(Available().source,
            "cgroup /kubepods/pod1's memory.limit_in_bytes");
}

TEST_F(FakeRoot, ALimitAboveTheMachineIsTheMachine) {
  Write("proc/meminfo", kMeminfo);
  Write("proc/self/cgroup", "0::/big\n");
  Write("sys/fs/cgroup/big/memory.max", "1099511627776\n");
  EXPECT_EQ(Available().bytes, kMachine);
}

TEST_F(FakeRoot, UnreadableMachineMemoryIsAnError) {
  EXPECT_EQ(MemoryAvailableToThisProcess(root_.string()).status().code(),
            absl::StatusCode::kNotFound);
  Write("proc/meminfo", "MemFree: 10 kB\n");
  EXPECT_EQ(MemoryAvailableToThisProcess(root_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(FakeRoot, ALimitIsNoneBytesOrAShare) {
  Write("proc/meminfo", kMeminfo);
  Write("proc/self/cgroup", "0::/job\n");
  Write("sys/fs/cgroup/job/memory.max", "4294967296\n");
  const std::string root = root_.string();
  EXPECT_EQ(ParseMemoryLimit("0", root)->bytes, 0);
  EXPECT_EQ(ParseMemoryLimit("0", root)->description, "none");
  EXPECT_EQ(ParseMemoryLimit("1048576", root)->bytes, 1 << 20);
  EXPECT_EQ(ParseMemoryLimit("25%", root)->bytes, int64_t{1} << 30);
  EXPECT_EQ(ParseMemoryLimit("25%", root)->description,
            "25% of cgroup /job's memory.max (4096 MiB): 1024 MiB");
  EXPECT_EQ(ParseMemoryLimit("12.5%", root)->bytes, int64_t{512} << 20);
  for (const char* bad : {"-1", "", "x", "0%", "101%", "-5%", "1GiB"}) {
    EXPECT_EQ(ParseMemoryLimit(bad, root).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST_F(FakeRoot, AShareOfUnreadableMemoryIsAnError) {
  EXPECT_EQ(ParseMemoryLimit("25%", root_.string()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseMemoryLimit("4096", root_.string())->bytes, 4096);
}

TEST(MemoryAvailableTest, ThisMachineHasSome) {
  absl::StatusOr<MemoryAvailable> available = MemoryAvailableToThisProcess();
  ASSERT_TRUE(available.ok()) << available.status();
  EXPECT_GT(available->bytes, 0);
}

}  // namespace
}  // namespace gradsync
