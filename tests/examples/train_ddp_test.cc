// examples/train_ddp, the public library's example, run as docs/cpp.md shows
// it: two processes of a job through a real coordinator train, checkpoint,
// and a second run resumes from the newest checkpoint.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::TempPath;
using ::gradsync::testing::WaitAll;
using ::testing::HasSubstr;

TEST(TrainDdpExampleTest, TrainsChecksPointsAndResumes) {
  CoordinatorProcess coordinator;
  ASSERT_TRUE(coordinator.Start(Runfile("server/gradsync-coordinator"), "example"));
  const std::string dir = TempPath("example-checkpoints");
  auto run = [&](const std::string& job, int steps) {
    std::vector<std::unique_ptr<Child>> children;
    for (int i = 0; i < 2; ++i) {
      children.push_back(std::make_unique<Child>());
      EXPECT_TRUE(children.back()->Start(
          {Runfile("examples/train_ddp"),
           absl::StrCat("--coordinator=", coordinator.address()),
           absl::StrCat("--job=", job), "--nproc_per_node=2",
           absl::StrCat("--steps=", steps), absl::StrCat("--checkpoint_dir=", dir)},
          /*capture=*/true));
    }
    EXPECT_TRUE(WaitAll({children[0].get(), children[1].get()}, absl::Seconds(120)));
    std::string out;
    for (const auto& c : children) {
      EXPECT_EQ(c->exit_code(), 0) << c->describe();
      absl::StrAppend(&out, c->out());
    }
    return out;
  };
  const std::string first = run("example", 30);
  EXPECT_THAT(first, HasSubstr("step 30 loss"));
  EXPECT_THAT(first, HasSubstr("train_ddp: done after 30 steps"));
  const std::string second = run("example-more", 40);
  EXPECT_THAT(second, HasSubstr("resuming from the checkpoint of step 30"));
  EXPECT_THAT(second, HasSubstr("train_ddp: done after 40 steps"));
  EXPECT_THAT(second, ::testing::Not(HasSubstr("step 20 loss")));
  EXPECT_TRUE(coordinator.Stop());
}

}  // namespace
}  // namespace gradsync
