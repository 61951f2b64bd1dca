#include "bench/line_child.h"

#include <csignal>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<LineChild> Shell(const std::string& script) {
  absl::StatusOr<std::unique_ptr<LineChild>> child =
      LineChild::Start({"/bin/sh", "-c", script});
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? *std::move(child) : nullptr;
}

TEST(LineChildTest, AnswersLineByLineAndExitsWhenItsInputCloses) {
  std::unique_ptr<LineChild> child =
      Shell("echo ready; while read l; do echo \"got $l\"; done");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->Ask("", absl::Seconds(30)).value_or("?"), "ready");
  EXPECT_EQ(child->Ask("one", absl::Seconds(30)).value_or("?"), "got one");
  EXPECT_EQ(child->Ask("two", absl::Seconds(30)).value_or("?"), "got two");
  EXPECT_TRUE(child->Close(absl::Seconds(30)).ok());
}

TEST(LineChildTest, LinesPrintedTogetherAreReturnedOneAtATime) {
  std::unique_ptr<LineChild> child = Shell("printf 'a\\nb\\n'; read l");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->Ask("", absl::Seconds(30)).value_or("?"), "a");
  EXPECT_EQ(child->Ask("", absl::Seconds(30)).value_or("?"), "b");
}

TEST(LineChildTest, AChildThatDoesNotAnswerTimesOut) {
  // exec: no grandchild outlives the kill holding the test's output open.
  std::unique_ptr<LineChild> child = Shell("read l; exec sleep 60");
  ASSERT_NE(child, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> answer =
      child->Ask("hello", absl::Milliseconds(200));
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // The destructor kills it (the test would otherwise wait for sleep).
}

TEST(LineChildTest, AChildThatExitedIsUnavailableAndItsCodeReported) {
  std::unique_ptr<LineChild> child = Shell("exit 3");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->Ask("", absl::Seconds(30)).status().code(),
            absl::StatusCode::kUnavailable);
  const absl::Status closed = child->Close(absl::Seconds(30));
  EXPECT_THAT(closed.message(), HasSubstr("exited with 3"));
}

TEST(LineChildTest, AChildThatIgnoresItsInputClosingIsKilled) {
  std::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<LineChild> child = Shell("exec sleep 60");
  ASSERT_NE(child, nullptr);
  const absl::Status closed = child->Close(absl::Milliseconds(200));
  EXPECT_EQ(closed.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(closed.message(), HasSubstr("killed"));
  EXPECT_EQ(child->Ask("more", absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(LineChildTest, AMissingProgramExitsWith127) {
  absl::StatusOr<std::unique_ptr<LineChild>> child =
      LineChild::Start({"/nonexistent/program"});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_THAT((*child)->Close(absl::Seconds(30)).message(),
              HasSubstr("exited with 127"));
}

}  // namespace
}  // namespace gradsync
