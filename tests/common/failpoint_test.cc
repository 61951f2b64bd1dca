#include "common/failpoint.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ExitedWithCode;
using ::testing::HasSubstr;

TEST(FailpointTest, BadSpecsAreRefusedAndArmNothing) {
  for (const char* spec : {"nope", "state_transfer:0", "state_transfer:x",
                           "state_transfer:", "state_transfer:-1"}) {
    absl::Status armed = ArmFailpoint(spec);
    EXPECT_EQ(armed.code(), absl::StatusCode::kInvalidArgument) << spec;
  }
  EXPECT_THAT(ArmFailpoint("nope").message(),
              HasSubstr("unknown failpoint 'nope' (known: state_transfer, step)"));
  Failpoint(kFailpointStateTransfer);  // disarmed: passes
}

TEST(FailpointDeathTest, ExitsOnTheArmedPass) {
  EXPECT_EXIT(
      {
        if (!ArmFailpoint("state_transfer:3").ok()) std::_Exit(1);
        Failpoint(kFailpointStateTransfer);
        Failpoint("another_place");  // not armed: passes, not counted
        Failpoint(kFailpointStateTransfer);
        std::fprintf(stderr, "two passes survived\n");
        Failpoint(kFailpointStateTransfer);
        std::_Exit(0);
      },
      ExitedWithCode(kFailpointExitCode),
      "two passes survived\nfailpoint state_transfer hit: exiting with code 86");
}

}  // namespace
}  // namespace gradsync
