#include "worker/launch/local_process.h"

#include <signal.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Everything `fd` delivers until end of file.
std::string ReadAll(int fd) {
  std::string out;
  char buffer[256];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) {
    out.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

TEST(LocalProcessTest, RunsWithItsEnvironmentAndReportsTheExitCode) {
  auto process = LocalProcess::Start(
      {"/bin/sh", "-c", "echo \"out $GREETING\"; echo err >&2; exit 7"},
      {"GREETING=hello"});
  ASSERT_TRUE(process.ok()) << process.status();
  const int out = (*process)->TakeStdout();
  const int err = (*process)->TakeStderr();
  EXPECT_EQ(ReadAll(out), "out hello\n");
  EXPECT_EQ(ReadAll(err), "err\n");
  EXPECT_EQ((*process)->Wait(), 7);
}

TEST(LocalProcessTest, SignalStopsTheProcessGroup) {
  // The shell's child (sleep) is in the same group: both stop.
  auto process = LocalProcess::Start({"/bin/sh", "-c", "sleep 60; exit 0"}, {});
  ASSERT_TRUE(process.ok()) << process.status();
  (*process)->Signal(SIGTERM);
  EXPECT_EQ((*process)->Wait(), 128 + SIGTERM);
  const int out = (*process)->TakeStdout();
  EXPECT_EQ(ReadAll(out), "");  // end of file: nothing holds the pipe
  (*process)->Signal(SIGKILL);   // reaped: a no-op
}

TEST(LocalProcessTest, ExitTextNamesTheSignal) {
  EXPECT_EQ(ExitText(0), "exited with code 0");
  EXPECT_EQ(ExitText(3), "exited with code 3");
  EXPECT_EQ(ExitText(128 + SIGKILL), "exited with code 137 (SIGKILL)");
  EXPECT_EQ(ExitText(128 + SIGTERM), "exited with code 143 (SIGTERM)");
  EXPECT_EQ(ExitText(255), "exited with code 255");
}

TEST(LocalProcessTest, AProgramThatCannotRunIsNotFound) {
  auto process = LocalProcess::Start({"/nonexistent/train"}, {});
  ASSERT_FALSE(process.ok());
  EXPECT_TRUE(absl::IsNotFound(process.status())) << process.status();
  EXPECT_THAT(std::string(process.status().message()),
              HasSubstr("cannot run '/nonexistent/train'"));
}

}  // namespace
}  // namespace gradsync
