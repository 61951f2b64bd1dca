#include "common/failpoint.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ExitedWithCode;
using ::testing::HasSubstr;

TEST(FailpointTest, BadSpecsAreRefusedAndArmNothing) {
  for (const char* spec :
       {"nope", "state_transfer:0", "state_transfer:x", "state_transfer:",
        "state_transfer:-1", "step,nope", "nccl_hang:2,nccl_hang:3"}) {
    absl::Status armed = ArmFailpoint(spec);
    EXPECT_EQ(armed.code(), absl::StatusCode::kInvalidArgument) << spec;
  }
  EXPECT_THAT(ArmFailpoint("nope").message(),
              HasSubstr("unknown failpoint 'nope' (known: state_transfer, "
                        "step, nccl_async_error, nccl_hang, "
                        "corrupt_parameters, hang)"));
  EXPECT_THAT(ArmFailpoint("nccl_hang:2,nccl_hang:3").message(),
              HasSubstr("'nccl_hang' is listed twice"));
  EXPECT_FALSE(FailpointArmed(kFailpointStep));  // "step,nope" armed nothing
  Failpoint(kFailpointStateTransfer);  // disarmed: passes
}

TEST(FailpointDeathTest, SeveralFaultsFireEachOnItsOwnPass) {
  EXPECT_EXIT(
      {
        if (!ArmFailpoint("nccl_async_error:2,nccl_hang:1").ok()) std::_Exit(1);
        if (!FailpointArmed(kFailpointNcclHang)) std::_Exit(2);
        if (!FailpointFires(kFailpointNcclHang)) std::_Exit(3);
        if (FailpointFires(kFailpointNcclHang)) std::_Exit(4);  // once only
        if (FailpointArmed(kFailpointNcclHang)) std::_Exit(5);
        if (FailpointFires(kFailpointNcclAsyncError)) std::_Exit(6);
        if (!FailpointFires(kFailpointNcclAsyncError)) std::_Exit(7);
        std::_Exit(0);
      },
      ExitedWithCode(0),
      "failpoint nccl_hang hit\nfailpoint nccl_async_error hit\n");
}

// A step-keyed failpoint fires at its step, however many passes came
// before, and once.
TEST(FailpointDeathTest, AStepKeyedFaultFiresAtItsStep) {
  EXPECT_EXIT(
      {
        if (!ArmFailpoint("corrupt_parameters:40").ok()) std::_Exit(1);
        for (int64_t step = 35; step < 40; ++step) {
          if (FailpointFiresAtStep(kFailpointCorruptParameters, step)) {
            std::_Exit(2);
          }
        }
        if (!FailpointFiresAtStep(kFailpointCorruptParameters, 40)) std::_Exit(3);
        if (FailpointFiresAtStep(kFailpointCorruptParameters, 40)) std::_Exit(4);
        std::_Exit(0);
      },
      ExitedWithCode(0), "failpoint corrupt_parameters hit at step 40\n");
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
