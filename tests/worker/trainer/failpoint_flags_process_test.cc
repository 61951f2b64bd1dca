// gradsync-worker refuses the NCCL failpoints where they cannot apply: with
// --device=cpu, --backend=gloo or --standalone no NCCL collective runs, so
// --failpoint=nccl_hang (or nccl_async_error) would silently inject nothing.
// It is refused before the worker joins or trains: exit 1, naming the
// failpoint and what it needs. The real binary, started as a user would; no
// coordinator is needed (nothing gets as far as joining).
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::WaitAll;
using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(30);

// Starts gradsync-worker with `flags` (after a coordinator address nothing
// listens on), output captured.
std::unique_ptr<Child> StartWorker(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {Runfile("worker/gradsync-worker"),
                                   "--coordinator=127.0.0.1:1", "--job=refused",
                                   "--nnodes=1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto child = std::make_unique<Child>();
  EXPECT_TRUE(child->Start(argv, /*capture=*/true));
  return child;
}

// Where no NCCL collective can run: the check runs before anything else, so
// each process ends at once (about a second, mostly loading LibTorch).
class FailpointFlagsProcessTest
    : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(FailpointFlagsProcessTest, AnNcclFailpointIsRefused) {
  std::unique_ptr<Child> child = StartWorker(GetParam());
  ASSERT_TRUE(WaitAll({child.get()}, kBound));
  EXPECT_EQ(child->exit_code(), 1) << child->describe();
  EXPECT_THAT(child->err(),
              HasSubstr("gradsync-worker: INVALID_ARGUMENT: --failpoint=nccl_"))
      << child->describe();
  EXPECT_THAT(child->err(),
              HasSubstr(" injects into NCCL collectives: it needs "
                        "--device=cuda or --device=sim, a coordinator "
                        "and a backend other than gloo"))
      << child->describe();
}

INSTANTIATE_TEST_SUITE_P(
    WhereNcclCannotRun, FailpointFlagsProcessTest,
    ::testing::Values(
        std::vector<std::string>{"--device=cpu", "--failpoint=nccl_hang:1"},
        std::vector<std::string>{"--device=sim", "--backend=gloo",
                                 "--failpoint=nccl_async_error:2"},
        std::vector<std::string>{"--device=sim", "--standalone",
                                 "--failpoint=step:5,nccl_hang:1"}));

}  // namespace
}  // namespace gradsync
