#include "worker/launch/gpus.h"

#include <map>

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

}  // namespace
}  // namespace gradsync
