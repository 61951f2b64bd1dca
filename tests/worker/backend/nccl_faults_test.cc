// The NCCL faults gradsync-worker's failpoints inject (FailpointCommFaults):
// each armed failpoint counts every collective on its own. Arming is
// process-wide and cannot be undone, so each case arms in a child process
// (a death test).
#include "worker/backend/nccl_faults.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/failpoint.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ExitedWithCode;

// The kinds `plan` gives collectives 1..5, one letter each: '-' none,
// 'E' an asynchronous error, 'H' a hang, 'D' a delay.
std::string KindsOfTheFirstFive(const CommFaultPlan& plan) {
  std::string kinds;
  for (uint64_t n = 1; n <= 5; ++n) {
    switch (plan(n).kind) {
      case CommFault::Kind::kNone: kinds += '-'; break;
      case CommFault::Kind::kAsyncError: kinds += 'E'; break;
      case CommFault::Kind::kHang: kinds += 'H'; break;
      case CommFault::Kind::kDelay: kinds += 'D'; break;
    }
  }
  return kinds;
}

// Prints what `spec`'s plan gives the first five collectives and exits 0,
// or exits non-zero when the plan cannot be made (in a child process).
[[noreturn]] void PrintKindsOfTheFirstFive(const char* spec) {
  if (FailpointCommFaults() != nullptr) std::_Exit(1);  // none armed: no plan
  if (!ArmFailpoint(spec).ok()) std::_Exit(2);
  const CommFaultPlan plan = FailpointCommFaults();
  if (plan == nullptr) std::_Exit(3);
  std::fprintf(stderr, "kinds %s\n", KindsOfTheFirstFive(plan).c_str());
  std::_Exit(0);
}

// The hang comes on its own 3rd collective although the error fired on the
// 2nd: the error's pass does not keep the hang from counting.
TEST(FailpointCommFaultsDeathTest, EachArmedFailpointCountsEveryCollective) {
  EXPECT_EXIT(PrintKindsOfTheFirstFive("nccl_async_error:2,nccl_hang:3"),
              ExitedWithCode(0),
              "failpoint nccl_async_error hit\n"
              "failpoint nccl_hang hit\n"
              "kinds -EH--\n");
}

// Armed for the same collective, both fire (both are logged) and the
// collective gets the asynchronous error.
TEST(FailpointCommFaultsDeathTest, BothOnOneCollectiveGiveTheAsyncError) {
  EXPECT_EXIT(PrintKindsOfTheFirstFive("nccl_hang:2,nccl_async_error:2"),
              ExitedWithCode(0),
              "failpoint nccl_async_error hit\n"
              "failpoint nccl_hang hit\n"
              "kinds -E---\n");
}

}  // namespace
}  // namespace gradsync
